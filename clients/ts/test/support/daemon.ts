// A real xumd for the tests: started on a temp root, ready when it answers `hello` on its socket
// (polled with a deadline: Node cannot bind the datagram NOTIFY_SOCKET the Python tests use).
//
// The daemon command: $XUMD (a path; the pytest wrapper sets it), else the repository's
// .venv/bin/xumd (`make install`).

import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createConnection } from "node:net";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, "pyproject.toml")) && existsSync(join(dir, "protocol"))) return dir;
    const parent = dirname(dir);
    if (parent === dir) throw new Error("repository root not found above " + fileURLToPath(import.meta.url));
    dir = parent;
  }
}

export function xumdCommand(): string[] {
  const env = process.env["XUMD"];
  if (env) return env.split(" ").filter(Boolean);
  return [join(repoRoot(), ".venv", "bin", "xumd")];
}

/** A short directory under /tmp: a Unix socket path has at most 107 bytes. */
export function shortTmpdir(prefix = "xts-"): string {
  return mkdtempSync(join("/tmp", prefix));
}

/** Polls `check` until it returns a value other than undefined/false, or the deadline passes. */
export async function until<T>(
  check: () => T | undefined | false | Promise<T | undefined | false>,
  what: string,
  timeoutMs = 20_000,
  intervalMs = 20,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

function helloOnce(path: string): Promise<boolean> {
  return new Promise((resolvePromise) => {
    const sock = createConnection({ path });
    let buf = "";
    const done = (ok: boolean): void => {
      sock.destroy();
      resolvePromise(ok);
    };
    sock.setTimeout(2000, () => done(false));
    sock.on("error", () => done(false));
    sock.on("connect", () => {
      sock.write(JSON.stringify({ jsonrpc: "2.0", id: 1, method: "daemon.status" }) + "\n");
    });
    sock.on("data", (chunk) => {
      buf += chunk.toString();
      if (buf.includes("\n")) done(buf.includes('"result"'));
    });
  });
}

export interface DaemonOptions {
  config?: string;
  env?: Record<string, string>;
  args?: string[];
  socketPath?: string;
}

export class Daemon {
  proc: ChildProcess | null = null;
  exit: Promise<number | null> | null = null;
  readonly logPath: string;

  constructor(
    readonly root: string,
    private readonly options: DaemonOptions = {},
  ) {
    this.logPath = `${root}.xumd.log`;
    mkdirSync(root, { recursive: true, mode: 0o700 });
    writeFileSync(join(root, "config.toml"), "enable_test_methods = true\n" + (options.config ?? ""));
  }

  get socketPath(): string {
    return this.options.socketPath ?? join(this.root, "xumd.sock");
  }

  get pid(): number {
    if (this.proc?.pid === undefined) throw new Error("not started");
    return this.proc.pid;
  }

  async start(): Promise<this> {
    const [cmd, ...pre] = xumdCommand();
    if (cmd === undefined) throw new Error("no xumd command");
    const env: Record<string, string | undefined> = { ...process.env, ...this.options.env };
    delete env["XUM_SOCKET"];
    delete env["NOTIFY_SOCKET"];
    if (this.options.env?.["XUM_SOCKET"]) env["XUM_SOCKET"] = this.options.env["XUM_SOCKET"];
    const log = openSync(this.logPath, "a");
    const args = [...pre, "--root", this.root, "--log-level", "debug", ...(this.options.args ?? [])];
    if (this.options.socketPath) args.push("--socket", this.options.socketPath);
    const proc = spawn(cmd, args, { stdio: ["ignore", log, log], env });
    closeSync(log);
    this.proc = proc;
    this.exit = new Promise((resolveExit) => proc.once("exit", (code) => resolveExit(code)));
    let exited = false;
    void this.exit.then(() => {
      exited = true;
    });
    await until(
      async () => {
        if (exited) throw new Error(`xumd exited before it was ready; log:\n${this.logTail()}`);
        return helloOnce(this.socketPath);
      },
      "xumd to answer on its socket",
    );
    return this;
  }

  logTail(): string {
    try {
      return readFileSync(this.logPath, "utf8").slice(-4000);
    } catch {
      return "";
    }
  }

  private async signal(sig: NodeJS.Signals, timeoutMs: number): Promise<number | null> {
    const proc = this.proc;
    if (proc === null || this.exit === null) return null;
    if (proc.exitCode === null && proc.signalCode === null) proc.kill(sig);
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`xumd did not exit within ${timeoutMs} ms of ${sig}`)), timeoutMs);
    });
    try {
      return await Promise.race([this.exit, timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** SIGTERM and wait for the exit. */
  stop(): Promise<number | null> {
    return this.signal("SIGTERM", 20_000);
  }

  /** SIGKILL (the socket file stays behind: a stale socket). */
  kill(): Promise<number | null> {
    return this.signal("SIGKILL", 10_000);
  }

  async close(): Promise<void> {
    try {
      await this.stop();
    } catch {
      await this.kill();
    }
  }
}

/** A daemon on a fresh temp root, closed and removed when the test ends. */
export async function withDaemon<T>(
  fn: (daemon: Daemon, tmp: string) => Promise<T>,
  options: DaemonOptions = {},
): Promise<T> {
  const tmp = shortTmpdir();
  const daemon = new Daemon(join(tmp, "r"), options);
  try {
    await daemon.start();
    return await fn(daemon, tmp);
  } finally {
    await daemon.close();
    rmSync(tmp, { recursive: true, force: true });
  }
}

/** A real git repository with one commit: a README and `files` (relative path -> content). */
export function makeRepo(path: string, files: Record<string, string> = {}): string {
  mkdirSync(path, { recursive: true });
  const git = (...args: string[]): void => {
    execFileSync("git", args, {
      cwd: path,
      stdio: "ignore",
      env: {
        ...process.env,
        GIT_AUTHOR_NAME: "t",
        GIT_AUTHOR_EMAIL: "t@example.invalid",
        GIT_COMMITTER_NAME: "t",
        GIT_COMMITTER_EMAIL: "t@example.invalid",
      },
    });
  };
  git("init", "-q", "-b", "main");
  writeFileSync(join(path, "README.md"), "hello\n");
  for (const [name, content] of Object.entries(files)) {
    mkdirSync(dirname(join(path, name)), { recursive: true });
    writeFileSync(join(path, name), content);
  }
  git("add", "-A");
  git("commit", "-q", "-m", "init");
  return resolve(path);
}

/**
 * `count` archived workspaces written straight into ROOT's store (tests/support/manyrows.py, as
 * bench/scale.py populates a root): run before the daemon starts on ROOT. Returns the project id.
 */
export function populate(root: string, count: number): string {
  const python = process.env["XUM_PYTHON"] || join(repoRoot(), ".venv", "bin", "python");
  const out = execFileSync(python, ["-m", "tests.support.manyrows", root, String(count)], {
    cwd: repoRoot(),
    encoding: "utf8",
  });
  // The id is the last line: the store may log before it (a slow statement on a loaded machine).
  return out.trim().split("\n").pop() ?? "";
}
