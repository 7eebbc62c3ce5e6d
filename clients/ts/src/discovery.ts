// Finding the daemon: one rule everywhere (the CLI, the Python client, the Neovim plugin).
//   XUM_SOCKET wins, else $XUM_ROOT/xumd.sock, else the default root's socket, where the default
//   root is $XDG_STATE_HOME/xum, else ~/.local/state/xum.
// An empty variable counts as unset (as the daemon and the Python client read them).

import { homedir } from "node:os";
import { join } from "node:path";

export type SocketSource = "XUM_SOCKET" | "XUM_ROOT" | "XDG_STATE_HOME" | "HOME" | "explicit";

export interface ResolvedSocket {
  /** The socket path to connect to. */
  path: string;
  /** Which rule chose it. */
  source: SocketSource;
  /** The root the path belongs to, when known (not for XUM_SOCKET). */
  root: string | null;
}

export type Env = Readonly<Record<string, string | undefined>>;

/** The default root: $XUM_ROOT, else $XDG_STATE_HOME/xum, else ~/.local/state/xum. */
export function defaultRoot(env: Env = process.env, home: string = homedir()): string {
  if (env["XUM_ROOT"]) return env["XUM_ROOT"];
  if (env["XDG_STATE_HOME"]) return join(env["XDG_STATE_HOME"], "xum");
  return join(home, ".local", "state", "xum");
}

/** The socket a client should connect to, and why. */
export function resolveSocket(env: Env = process.env, home: string = homedir()): ResolvedSocket {
  if (env["XUM_SOCKET"]) return { path: env["XUM_SOCKET"], source: "XUM_SOCKET", root: null };
  if (env["XUM_ROOT"]) {
    return { path: join(env["XUM_ROOT"], "xumd.sock"), source: "XUM_ROOT", root: env["XUM_ROOT"] };
  }
  const root = defaultRoot(env, home);
  return {
    path: join(root, "xumd.sock"),
    source: env["XDG_STATE_HOME"] ? "XDG_STATE_HOME" : "HOME",
    root,
  };
}
