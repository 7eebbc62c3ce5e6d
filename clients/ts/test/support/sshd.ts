// A real OpenSSH server on loopback for the host tests: the Python suite's
// (tests/support/sshd.py: throwaway keys, 127.0.0.1 only, an ssh_config with aliases), run by
// $XUM_PYTHON (the pytest wrapper sets it; else the repository's .venv python). It lives until
// `close()` ends its stdin. `skip` says why there is none (no sshd, not root).

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";

import { repoRoot } from "./daemon.js";

const SERVE = `
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.support.sshd import ALIAS, ALIAS_BADKEY, ALIAS_DOWN, SshServer, sshd_missing
why = sshd_missing()
if why:
    print(json.dumps({"skip": why}), flush=True)
    sys.exit(0)
server = SshServer(Path(sys.argv[2])).start()
try:
    print(json.dumps({"env": server.env(), "alias": ALIAS, "badkey": ALIAS_BADKEY,
                      "down": ALIAS_DOWN}), flush=True)
    sys.stdin.read()
finally:
    server.close()
`;

export interface Sshd {
  skip: string | null;
  /** XUM_SSH for the client side. */
  env: Record<string, string>;
  alias: string;
  badkey: string;
  down: string;
  close(): Promise<void>;
}

export function pythonCommand(): string {
  return process.env["XUM_PYTHON"] || join(repoRoot(), ".venv", "bin", "python");
}

export async function startSshd(base: string): Promise<Sshd> {
  const python = pythonCommand();
  if (!existsSync(python)) return skipped(`no python at ${python}`);
  const proc: ChildProcess = spawn(python, ["-c", SERVE, repoRoot(), base], {
    stdio: ["pipe", "pipe", "inherit"],
    cwd: repoRoot(),
  });
  const lines = createInterface({ input: proc.stdout! });
  const first = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("sshd did not start within 60 s")), 60_000);
    lines.once("line", (line) => {
      clearTimeout(timer);
      resolve(line);
    });
    proc.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`the sshd helper exited with ${String(code)}`));
    });
  });
  const info = JSON.parse(first) as { skip?: string; env: Record<string, string>; alias: string; badkey: string; down: string };
  if (info.skip) return skipped(info.skip);
  const exited = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
  return {
    skip: null,
    env: info.env,
    alias: info.alias,
    badkey: info.badkey,
    down: info.down,
    async close() {
      proc.stdin?.end();
      await exited;
    },
  };
}

function skipped(reason: string): Sshd {
  return { skip: reason, env: {}, alias: "", badkey: "", down: "", close: async () => {} };
}
