// Finding the daemon: one rule everywhere (the daemon, the CLI, the Python client, the Neovim
// plugin; `xum_protocol.discovery.resolve_socket`).
//   An explicit socket, else an explicit root's socket, else XUM_SOCKET, else $XUM_ROOT/xumd.sock,
//   else the default root's socket, where the default root is $XDG_STATE_HOME/xum, else
//   ~/.local/state/xum.
// An empty variable counts as unset, and a leading `~` is $HOME (a setting or a config file has no
// shell to expand it).

import { homedir } from "node:os";
import { join } from "node:path";

export type SocketSource = "explicit" | "root" | "XUM_SOCKET" | "XUM_ROOT" | "XDG_STATE_HOME" | "HOME";

export interface ResolvedSocket {
  /** The socket path to connect to. */
  path: string;
  /** Which rule chose it. */
  source: SocketSource;
  /** The root the path belongs to, when known (not for a socket given as such). */
  root: string | null;
}

export type Env = Readonly<Record<string, string | undefined>>;

export interface Explicit {
  /** A socket path given by the caller (a setting, a flag): it wins. */
  socket?: string | undefined;
  /** A root given by the caller: its `xumd.sock`. */
  root?: string | undefined;
}

function homeOf(env: Env, home: string | undefined): string {
  return home ?? (env["HOME"] || homedir());
}

/** `~` and `~/...` with the home directory; anything else as it is. */
export function expandHome(path: string, env: Env = process.env, home?: string): string {
  if (path === "~" || path.startsWith("~/")) return homeOf(env, home) + path.slice(1);
  return path;
}

/** The default root: $XUM_ROOT, else $XDG_STATE_HOME/xum, else ~/.local/state/xum. */
export function defaultRoot(env: Env = process.env, home?: string): string {
  if (env["XUM_ROOT"]) return expandHome(env["XUM_ROOT"], env, home);
  if (env["XDG_STATE_HOME"]) return join(expandHome(env["XDG_STATE_HOME"], env, home), "xum");
  return join(homeOf(env, home), ".local", "state", "xum");
}

/** The socket a client should connect to, and why. */
export function resolveSocket(env: Env = process.env, home?: string, explicit: Explicit = {}): ResolvedSocket {
  if (explicit.socket) return { path: expandHome(explicit.socket, env, home), source: "explicit", root: null };
  if (explicit.root) {
    const root = expandHome(explicit.root, env, home);
    return { path: join(root, "xumd.sock"), source: "root", root };
  }
  if (env["XUM_SOCKET"]) return { path: expandHome(env["XUM_SOCKET"], env, home), source: "XUM_SOCKET", root: null };
  const root = defaultRoot(env, home);
  const source: SocketSource = env["XUM_ROOT"] ? "XUM_ROOT" : env["XDG_STATE_HOME"] ? "XDG_STATE_HOME" : "HOME";
  return { path: join(root, "xumd.sock"), source, root };
}
