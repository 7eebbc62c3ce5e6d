// Hosts: a daemon on another machine, reached through OpenSSH (docs/HOSTS.md). The same rules as
// the Python client (`xum_client.hosts`, `xum_client.sshlink`):
// - a host is a name in the hosts file ($XUM_HOSTS_FILE, else $XDG_CONFIG_HOME/xum/hosts.toml,
//   else ~/.config/xum/hosts.toml), or an entry given as such;
// - the transport is `ssh -T -o BatchMode=yes [-o K=V ...] -- DEST 'sh' '-c' '<script>' 'xum'
//   'bridge' ['--root' R]`, where the script runs the xum `xum host install` put under the host's
//   data directory, else `xum` from PATH, else ~/.local/bin/xum; $XUM_SSH replaces `ssh` (split as a shell would);
// - ssh runs in a process group of its own and is stopped with it when the connection closes;
// - ssh ending before the daemon answered is a `HostError` saying why (unreachable, key refused,
//   no xum there, the bridge failed); ending while a call is in flight is `ConnectionLost`, with
//   the outcome unknown and how to look.

import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { Duplex } from "node:stream";

import type { Env } from "./discovery.js";
import { ConnectionLost, XumClientError } from "./errors.js";

/** A host as the hosts file describes it. */
export interface HostEntry {
  name: string;
  /** Anything `ssh` accepts: `[user@]host`, `ssh://...`, an ~/.ssh/config alias. */
  dest: string;
  /** The daemon root on the host (default: the host's own default root). */
  remoteRoot?: string | null;
  /** `ssh -o K=V` each. */
  sshOptions?: Record<string, string>;
}

/** Run on the host by `sh -c` (the same text as `xum_client.hosts.REMOTE_XUM_SCRIPT`). */
export const REMOTE_XUM_SCRIPT =
  'x="${XDG_DATA_HOME:-$HOME/.local/share}/xum/venv/bin/xum"; ' +
  'if [ -x "$x" ]; then exec "$x" "$@"; fi; ' +
  'if command -v xum >/dev/null 2>&1; then exec xum "$@"; fi; ' +
  'if [ -x "$HOME/.local/bin/xum" ]; then exec "$HOME/.local/bin/xum" "$@"; fi; ' +
  'exec xum "$@"';

const NAME_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;
const OPTION_KEY_RE = /^[A-Za-z][A-Za-z0-9]{0,63}$/;
// eslint-disable-next-line no-control-regex
const CONTROL_RE = /[\u0000-\u001f\u007f]/;

/** The hosts file cannot be read, or an entry is invalid (the message names which). */
export class HostConfigError extends XumClientError {
  override name = "HostConfigError";
}

/** A host could not be reached: nothing ran there. `kind` says why. */
export class HostError extends XumClientError {
  override name = "HostError";
  readonly kind: string = "host_error";
  constructor(
    message: string,
    readonly host: string,
    /** ssh's exit status (null: killed by a signal). */
    readonly status: number | null,
    /** The last line ssh (or the remote shell, or the bridge) wrote on stderr. */
    readonly detail: string,
  ) {
    super(message);
  }
}

/** ssh could not reach the host (exit 255: refused, timed out, no route, name unknown). */
export class HostUnreachable extends HostError {
  override name = "HostUnreachable";
  override readonly kind = "host_unreachable";
}

/** The host refused every key ssh offered. */
export class HostKeyRefused extends HostError {
  override name = "HostKeyRefused";
  override readonly kind = "host_key_refused";
}

/** ssh could not verify the host's key: unknown, or changed since it was accepted. */
export class HostKeyUnverified extends HostError {
  override name = "HostKeyUnverified";
  override readonly kind = "host_key_unverified";
}

/** The host's shell found no xum (exit 127): `xum host install NAME`. */
export class XumMissingOnHost extends HostError {
  override name = "XumMissingOnHost";
  override readonly kind = "xum_missing";
}

/** `xum bridge` on the host reached no daemon (it says why). */
export class BridgeFailed extends HostError {
  override name = "BridgeFailed";
  override readonly kind = "bridge_failed";
}

/** The connection to a host dropped while calls were in flight: their outcome is unknown. */
export class HostConnectionLost extends ConnectionLost {
  override name = "HostConnectionLost";
  readonly kind = "connection_lost";
  constructor(
    message: string,
    readonly host: string,
    call?: { method: string; sent: boolean },
  ) {
    super(message, call);
  }
}

export function hostsFile(env: Env = process.env): string {
  if (env["XUM_HOSTS_FILE"]) return expand(env["XUM_HOSTS_FILE"], env);
  const config = env["XDG_CONFIG_HOME"] ? expand(env["XDG_CONFIG_HOME"], env) : join(home(env), ".config");
  return join(config, "xum", "hosts.toml");
}

function home(env: Env): string {
  return env["HOME"] || homedir();
}

function expand(path: string, env: Env): string {
  return path === "~" || path.startsWith("~/") ? home(env) + path.slice(1) : path;
}

export function checkEntry(entry: HostEntry): HostEntry {
  if (!NAME_RE.test(entry.name)) throw new HostConfigError(`invalid host name ${JSON.stringify(entry.name)}`);
  const dest = entry.dest;
  if (!dest || dest.startsWith("-") || CONTROL_RE.test(dest) || /\s/.test(dest)) {
    throw new HostConfigError(`host ${entry.name}: invalid destination ${JSON.stringify(dest)}`);
  }
  if (entry.remoteRoot !== undefined && entry.remoteRoot !== null) {
    if (!entry.remoteRoot || CONTROL_RE.test(entry.remoteRoot)) {
      throw new HostConfigError(`host ${entry.name}: invalid remote root ${JSON.stringify(entry.remoteRoot)}`);
    }
  }
  for (const [key, value] of Object.entries(entry.sshOptions ?? {})) {
    if (!OPTION_KEY_RE.test(key) || typeof value !== "string" || CONTROL_RE.test(value)) {
      throw new HostConfigError(`host ${entry.name}: invalid ssh option ${JSON.stringify(key)}`);
    }
  }
  return entry;
}

// The hosts file is TOML. Node has no TOML reader, so this is the subset a hosts file needs,
// read by TOML's rules (the Python client reads it with tomllib, and the two must agree: the
// cases in tests/support/hosts_file_cases.json): keys bare (A-Z a-z 0-9 _ -), "basic" or
// 'literal', dotted with `.` (so `[hosts.dev.box]` is host `dev` with a table `box`, and a
// host named `dev.box` is `[hosts."dev.box"]`), whitespace around dots; tables, dotted keys
// and inline tables; string values; comments. Anything else (numbers, arrays, multi-line
// strings, arrays of tables) is an error naming the line: no field of a host takes one.

type TomlTable = { [key: string]: TomlValue };
type TomlValue = string | TomlTable;

const BARE_KEY = /[A-Za-z0-9_-]/;

class TomlLine {
  i = 0;
  constructor(
    readonly text: string,
    readonly where: string,
  ) {}

  fail(why: string): never {
    throw new HostConfigError(`${this.where}: ${why}`);
  }

  ws(): void {
    while (this.i < this.text.length && (this.text[this.i] === " " || this.text[this.i] === "\t")) this.i++;
  }

  /** Whitespace, then a comment or nothing up to the end of the line. */
  end(): void {
    this.ws();
    if (this.i < this.text.length && this.text[this.i] !== "#") {
      this.fail(`not understood after ${JSON.stringify(this.text.slice(0, this.i).trim())}: ${this.text.slice(this.i)}`);
    }
  }

  peek(): string {
    return this.text[this.i] ?? "";
  }

  /** A dotted key: its parts. */
  key(): string[] {
    const parts: string[] = [];
    for (;;) {
      this.ws();
      const c = this.peek();
      if (c === '"') parts.push(this.basic());
      else if (c === "'") parts.push(this.literal());
      else {
        const start = this.i;
        while (this.i < this.text.length && BARE_KEY.test(this.peek())) this.i++;
        if (this.i === start) this.fail(`expected a key at ${JSON.stringify(this.text.slice(start))}`);
        parts.push(this.text.slice(start, this.i));
      }
      this.ws();
      if (this.peek() !== ".") return parts;
      this.i++;
    }
  }

  basic(): string {
    if (this.text.startsWith('"""', this.i)) this.fail("multi-line strings are not read here");
    this.i++; // the opening quote
    let out = "";
    for (;;) {
      if (this.i >= this.text.length) this.fail("a string without its closing quote");
      const c = this.text[this.i++] as string;
      if (c === '"') return out;
      if (c !== "\\") {
        out += c;
        continue;
      }
      const e = this.text[this.i++] ?? "";
      const simple: Record<string, string> = { b: "\b", t: "\t", n: "\n", f: "\f", r: "\r", '"': '"', "\\": "\\" };
      if (e in simple) out += simple[e];
      else if (e === "u" || e === "U") {
        const size = e === "u" ? 4 : 8;
        const hex = this.text.slice(this.i, this.i + size);
        if (!new RegExp(`^[0-9A-Fa-f]{${size}}$`).test(hex)) this.fail(`a bad escape \\${e}${hex}`);
        const code = parseInt(hex, 16);
        if (code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) this.fail(`a bad escape \\${e}${hex}`);
        out += String.fromCodePoint(code);
        this.i += size;
      } else this.fail(`a bad escape \\${e}`);
    }
  }

  literal(): string {
    if (this.text.startsWith("'''", this.i)) this.fail("multi-line strings are not read here");
    const close = this.text.indexOf("'", this.i + 1);
    if (close < 0) this.fail("a string without its closing quote");
    const value = this.text.slice(this.i + 1, close);
    this.i = close + 1;
    return value;
  }

  value(): TomlValue {
    this.ws();
    const c = this.peek();
    if (c === '"') return this.basic();
    if (c === "'") return this.literal();
    if (c === "{") return this.inline();
    return this.fail(`expected a string, got ${this.text.slice(this.i).trim()}`);
  }

  inline(): TomlTable {
    this.i++; // {
    const table = Object.create(null) as TomlTable;
    this.ws();
    if (this.peek() === "}") {
      this.i++;
      return table;
    }
    for (;;) {
      const path = this.key();
      if (this.peek() !== "=") this.fail("expected `=` after a key");
      this.i++;
      assign(table, path, this.value(), this);
      this.ws();
      const c = this.text[this.i++];
      if (c === "}") return table;
      if (c !== ",") this.fail("expected `,` or `}` in an inline table");
    }
  }
}

/** `value` at `path` under `table`, making the tables between; a key given twice is an error. */
function assign(table: TomlTable, path: string[], value: TomlValue, line: TomlLine): void {
  const at = descend(table, path.slice(0, -1), line);
  const last = path[path.length - 1] as string;
  if (Object.prototype.hasOwnProperty.call(at, last)) line.fail(`${JSON.stringify(path.join("."))} is defined twice`);
  at[last] = value;
}

function descend(table: TomlTable, path: string[], line: TomlLine): TomlTable {
  let at = table;
  for (const part of path) {
    // No prototype: a key named `__proto__` is a key like any other.
    if (!Object.prototype.hasOwnProperty.call(at, part)) at[part] = Object.create(null) as TomlTable;
    const next = at[part];
    if (typeof next !== "object") line.fail(`${JSON.stringify(path.join("."))} is not a table`);
    at = next;
  }
  return at;
}

/** The TOML subset above, as nested tables; the line of each `[hosts.NAME]` table. */
function parseToml(text: string, path: string): { data: TomlTable; lines: Map<string, number> } {
  const data: TomlTable = Object.create(null) as TomlTable;
  const defined = new Set<string>();
  const lines = new Map<string, number>();
  let current = data;
  const all = text.split("\n");
  for (let n = 0; n < all.length; n++) {
    const line = new TomlLine((all[n] ?? "").replace(/\r$/, ""), `${path}, line ${n + 1}`);
    line.ws();
    const c = line.peek();
    if (c === "" || c === "#") continue;
    if (c === "[") {
      line.i++;
      if (line.peek() === "[") line.fail("arrays of tables are not read here");
      const parts = line.key();
      if (line.peek() !== "]") line.fail("expected `]` after a table name");
      line.i++;
      line.end();
      // Each part is JSON-quoted: `a.b` and `"a.b"` are different tables.
      const id = JSON.stringify(parts);
      if (defined.has(id)) line.fail(`the table [${parts.join(".")}] is defined twice`);
      defined.add(id);
      if (parts.length === 2 && parts[0] === "hosts") lines.set(parts[1] as string, n + 1);
      current = descend(data, parts, line);
      continue;
    }
    const parts = line.key();
    if (line.peek() !== "=") line.fail(`not understood: ${line.text.trim()}`);
    line.i++;
    const value = line.value();
    line.end();
    assign(current, parts, value, line);
  }
  return { data, lines };
}

/**
 * The hosts file's entries (none when it does not exist): `[hosts.NAME]` tables of `dest`,
 * `remote_root` and `[hosts.NAME.ssh_options]`, as the Python client reads them (TOML: a name
 * with a dot is quoted, `[hosts."dev.box"]`); anything else is an error naming the file (and
 * the line where there is one).
 */
export function loadHosts(env: Env = process.env, path: string = hostsFile(env)): Map<string, HostEntry> {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return new Map();
    throw new HostConfigError(`cannot read hosts file ${path}: ${(err as Error).message}`);
  }
  const { data, lines } = parseToml(text, path);
  const unknown = Object.keys(data)
    .filter((k) => k !== "hosts")
    .sort();
  if (unknown.length > 0) throw new HostConfigError(`${path}: unknown top-level key ${JSON.stringify(unknown[0])} (only [hosts.NAME])`);
  const tables = data["hosts"] ?? {};
  if (typeof tables !== "object") throw new HostConfigError(`${path}: \`hosts\` must be a table of [hosts.NAME] tables`);
  const hosts = new Map<string, HostEntry>();
  for (const [name, table] of Object.entries(tables)) {
    const line = lines.get(name);
    const where = `${path}` + (line !== undefined ? `, line ${line}` : "") + ` ([hosts.${name}])`;
    if (typeof table !== "object") throw new HostConfigError(`${where}: must be a table`);
    const extra = Object.keys(table)
      .filter((k) => !["dest", "remote_root", "ssh_options"].includes(k))
      .sort();
    if (extra.length > 0) throw new HostConfigError(`${where}: unknown key ${JSON.stringify(extra[0])}`);
    const dest = table["dest"];
    const root = table["remote_root"];
    const options = table["ssh_options"] ?? {};
    if (typeof dest !== "string") throw new HostConfigError(`${where}: \`dest\` (a string) is required`);
    if (root !== undefined && typeof root !== "string") throw new HostConfigError(`${where}: \`remote_root\` must be a string`);
    if (typeof options !== "object" || !Object.values(options).every((v) => typeof v === "string")) {
      throw new HostConfigError(`${where}: \`ssh_options\` must be a table of strings`);
    }
    try {
      hosts.set(name, checkEntry({ name, dest, remoteRoot: root ?? null, sshOptions: { ...(options as Record<string, string>) } }));
    } catch (err) {
      if (err instanceof HostConfigError) throw new HostConfigError(`${where}: ${err.message}`);
      throw err;
    }
  }
  return hosts;
}

export function getHost(name: string, env: Env = process.env): HostEntry {
  const path = hostsFile(env);
  const hosts = loadHosts(env, path);
  const entry = hosts.get(name);
  if (entry === undefined) {
    const known = [...hosts.keys()].sort().join(", ") || "none";
    throw new HostConfigError(`no host ${JSON.stringify(name)} in ${path} (known: ${known}); add it with \`xum host add ${name} DEST\``);
  }
  return entry;
}

/** `s` quoted for a POSIX shell (as Python's shlex.quote). */
export function shellQuote(s: string): string {
  if (s === "") return "''";
  if (/^[A-Za-z0-9@%+=:,./_-]+$/.test(s)) return s;
  return "'" + s.replace(/'/g, `'"'"'`) + "'";
}

/**
 * $XUM_SSH split as a shell would, else `ssh`: the rules of Python's `shlex.split` (the Python
 * client's and the Neovim plugin's too): '...' literal; in "..." a backslash escapes only `"` and
 * `\`; outside quotes it escapes any character. An unclosed quote or a trailing backslash is a
 * HostConfigError, as in the Python client.
 */
export function sshProgram(env: Env = process.env): string[] {
  const text = env["XUM_SSH"] || "ssh";
  const refuse = (why: string): never => {
    throw new HostConfigError(`cannot split $XUM_SSH ${JSON.stringify(text)}: ${why}`);
  };
  const words: string[] = [];
  let word: string | null = null;
  let quote: string | null = null;
  for (let i = 0; i < text.length; i++) {
    const c = text[i] as string;
    if (quote === "'") {
      if (c === quote) quote = null;
      else word = (word ?? "") + c;
    } else if (quote === '"') {
      if (c === quote) quote = null;
      else if (c === "\\" && i + 1 < text.length) {
        const next = text[++i] as string;
        word = (word ?? "") + (next === '"' || next === "\\" ? next : c + next);
      } else word = (word ?? "") + c;
    } else if (c === "'" || c === '"') {
      quote = c;
      word ??= "";
    } else if (c === "\\") {
      if (i + 1 >= text.length) refuse("No escaped character");
      word = (word ?? "") + text[++i];
    } else if (" \t\r\n".includes(c)) {
      if (word !== null) words.push(word);
      word = null;
    } else {
      word = (word ?? "") + c;
    }
  }
  if (quote !== null) refuse("No closing quotation");
  if (word !== null) words.push(word);
  return words.length ? words : ["ssh"];
}

/** The argv that runs `xum bridge [--root R] [--socket S]` on the host. */
export function sshCommand(entry: HostEntry, env: Env = process.env, root?: string, socket?: string): string[] {
  checkEntry(entry);
  const options: string[] = [];
  for (const [key, value] of Object.entries(entry.sshOptions ?? {})) options.push("-o", `${key}=${value}`);
  const args = ["bridge"];
  const chosenRoot = root ?? entry.remoteRoot ?? null;
  if (chosenRoot) args.push("--root", chosenRoot);
  if (socket) args.push("--socket", socket);
  const remote = ["sh", "-c", REMOTE_XUM_SCRIPT, "xum", ...args].map(shellQuote).join(" ");
  return [...sshProgram(env), "-T", "-o", "BatchMode=yes", ...options, "--", entry.dest, remote];
}

const STDERR_CAP = 64 * 1024;
const EXIT_WAIT_MS = 5_000;
const KEY_REFUSED = ["Permission denied", "Too many authentication failures"];

/**
 * The error for an ssh that ended before the daemon answered anything, from its exit status and
 * stderr: the Python client's `sshlink.classify`, kind and message word for word (a shared table
 * of cases holds both to it: tests/support/ssh_failures.json).
 */
export function classifyFailure(entry: HostEntry, status: number | null, stderr: string): HostError {
  const lines = stderr.split("\n").map((l) => l.trim()).filter(Boolean);
  const detail = lines[lines.length - 1] ?? "";
  const name = entry.name;
  const where = `host '${name}' (${entry.dest})`;
  if (status === 255) {
    if (stderr.includes("Host key verification failed") || stderr.includes("HOST IDENTIFICATION HAS CHANGED")) {
      return new HostKeyUnverified(
        `${where}: ssh could not verify the host's key (${detail}): it is unknown or has changed; ` +
          `check it and accept it with \`ssh ${entry.dest}\` once`,
        name,
        status,
        detail,
      );
    }
    if (KEY_REFUSED.some((mark) => stderr.includes(mark))) {
      return new HostKeyRefused(
        `${where} refused the key: ${detail || "permission denied"} (ssh -v ${entry.dest} shows which keys were offered)`,
        name,
        status,
        detail,
      );
    }
    return new HostUnreachable(`${where} is unreachable: ${detail || "ssh failed"}`, name, status, detail);
  }
  if (status === 127) {
    return new XumMissingOnHost(
      `xum is not installed on ${where} (${detail || "command not found"}): install it with ` +
        `\`xum host install ${name}\`, or put xum on the PATH of its non-interactive shell`,
      name,
      status,
      detail,
    );
  }
  return new BridgeFailed(`the bridge on ${where} failed (ssh exit ${String(status)}): ${detail || "no message"}`, name, status, detail);
}

/** One `ssh ... xum bridge` process; `stream` carries the NDJSON both ways. */
export class HostLink {
  readonly stream: Duplex;
  private stderr = "";
  private exited: Promise<number | null>;
  private exitStatus: number | null | undefined = undefined;

  constructor(
    readonly entry: HostEntry,
    readonly child: ChildProcess,
  ) {
    if (child.stdout === null || child.stdin === null) throw new XumClientError("ssh has no pipes");
    this.stream = Duplex.from({ readable: child.stdout, writable: child.stdin });
    // Ending the stream ends ssh's group (ProxyCommand children included), not only ssh.
    this.stream.on("close", () => this.kill());
    child.stderr?.on("data", (chunk: Buffer) => {
      if (this.stderr.length < STDERR_CAP) this.stderr += chunk.toString("utf8");
    });
    this.exited = new Promise((resolve) => {
      child.once("exit", (code) => {
        this.exitStatus = code;
        // What ssh leaves in its group (a ProxyCommand's child) goes with it, whether ssh
        // ended by itself or was stopped: the group's id stays reserved while any member
        // lives, so this reaches only them (none left: ESRCH).
        if (child.pid !== undefined) {
          try {
            process.kill(-child.pid, "SIGKILL");
          } catch {
            // nothing left in the group
          }
        }
        resolve(code);
      });
      child.once("error", () => {
        this.exitStatus = null;
        resolve(null);
      });
    });
  }

  static open(entry: HostEntry, env: Env = process.env, root?: string, socket?: string): HostLink {
    const argv = sshCommand(entry, env, root, socket);
    const child = spawn(argv[0] as string, argv.slice(1), {
      stdio: ["pipe", "pipe", "pipe"],
      detached: true, // its own process group, stopped as a whole on close
      env: { ...process.env, ...env } as NodeJS.ProcessEnv,
    });
    return new HostLink(entry, child);
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  kill(): void {
    const pid = this.child.pid;
    if (pid === undefined || this.exitStatus !== undefined) return;
    try {
      process.kill(-pid, "SIGTERM");
    } catch {
      // already gone
    }
    const timer = setTimeout(() => {
      try {
        if (this.exitStatus === undefined) process.kill(-pid, "SIGKILL");
      } catch {
        // gone
      }
    }, 2_000);
    timer.unref();
    void this.exited.then(() => clearTimeout(timer));
  }

  /** ssh's exit status once it has ended (within a deadline), else undefined. */
  async status(waitMs = EXIT_WAIT_MS): Promise<number | null | undefined> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<undefined>((resolve) => {
      timer = setTimeout(() => resolve(undefined), waitMs);
    });
    try {
      return await Promise.race([this.exited, late]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Why the host could not be reached, from ssh's status and stderr (nothing ran there). */
  async failure(): Promise<HostError> {
    return classifyFailure(this.entry, (await this.status()) ?? null, this.stderr);
  }

  /**
   * The error for a call in flight when the connection dropped: sent (handed to ssh), its outcome
   * is unknown; not sent, the daemon there never saw it.
   */
  lost(method: string, sent = true): HostConnectionLost {
    const name = this.entry.name;
    if (!sent) {
      return new HostConnectionLost(
        `${method} was not sent: the connection to host ${name} was lost before the request went out; ` +
          "the daemon there never saw it",
        name,
        { method, sent },
      );
    }
    return new HostConnectionLost(
      `${method}: the connection to host ${name} was lost during the call; its outcome is unknown ` +
        `(the daemon there finishes or rolls it back): look with \`xum --host ${name} ws ls\``,
      name,
      { method, sent },
    );
  }
}
