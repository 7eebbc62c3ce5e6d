// A script as a user writes it: its own node process, importing this package's build, left to
// end by itself (no process.exit). The run has a deadline: a script still running then is
// killed, and `exited` says so, which is how a test sees that something kept Node alive.

import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL, fileURLToPath } from "node:url";

/** The built package's entry point (dist/src/index.js), as a URL a script can import. */
export const CLIENT_URL = pathToFileURL(fileURLToPath(new URL("../../src/index.js", import.meta.url))).href;

export interface ScriptRun {
  /** False when the deadline passed first and the script was killed. */
  exited: boolean;
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs `source` (an ES module; `$XUM_TEST_CLIENT` is the client's URL, for
 * `await import(process.env.XUM_TEST_CLIENT)`) in a new node process and waits for it to end, at
 * most `timeoutMs`.
 */
export async function runScript(
  source: string,
  options: {
    env?: Record<string, string | undefined>;
    timeoutMs?: number;
    args?: string[];
    /** Where the script is written (it resolves packages from there); default a temp dir, removed after. */
    dir?: string;
  } = {},
): Promise<ScriptRun> {
  const dir = options.dir ?? mkdtempSync(join("/tmp", "xts-script-"));
  const file = join(dir, "script.mjs");
  writeFileSync(file, source);
  const env: Record<string, string | undefined> = { ...process.env, XUM_TEST_CLIENT: CLIENT_URL, ...options.env };
  const child = spawn(process.execPath, [file, ...(options.args ?? [])], { cwd: dir, stdio: ["ignore", "pipe", "pipe"], env });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString("utf8")));
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString("utf8")));
  let exited = true;
  const timer = setTimeout(() => {
    exited = false;
    child.kill("SIGKILL");
  }, options.timeoutMs ?? 20_000);
  try {
    const code = await new Promise<number | null>((resolve, reject) => {
      child.once("error", reject);
      child.once("close", (status) => resolve(status));
    });
    return { exited, code, stdout, stderr };
  } finally {
    clearTimeout(timer);
    if (options.dir === undefined) rmSync(dir, { recursive: true, force: true });
  }
}
