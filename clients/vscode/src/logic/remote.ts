// A checkout on a host (the `xum.host` setting): its paths are the host's, so opening one goes
// there, as the tree's other commands do through the daemon. No `vscode` import.

import { shellQuote, sshProgram, type Env, type HostEntry } from "../../../ts/src/index.js";

/**
 * VS Code's remote authority for the host, as the Remote-SSH extension names one: `ssh-remote+`
 * and the ssh destination, plain when it stays a valid lower-case URI authority, else hex-encoded
 * JSON `{"hostName": DEST}` (its form for anything else: an authority is case-folded). Only the
 * destination goes: Remote-SSH reads the ssh options from ~/.ssh/config, not the hosts file.
 */
export function remoteAuthority(entry: HostEntry): string {
  if (/^[a-z0-9][a-z0-9._-]*$/.test(entry.dest)) return `ssh-remote+${entry.dest}`;
  return `ssh-remote+${Buffer.from(JSON.stringify({ hostName: entry.dest }), "utf8").toString("hex")}`;
}

/**
 * A terminal's command for a login shell in `path` on the host: ssh as `xum --host` runs it
 * ($XUM_SSH, the entry's options), with a terminal (`-t`) and without BatchMode, so that ssh may
 * ask for a password or a passphrase.
 */
export function terminalCommand(entry: HostEntry, path: string, env: Env = process.env): string[] {
  const options: string[] = [];
  for (const [key, value] of Object.entries(entry.sshOptions ?? {})) options.push("-o", `${key}=${value}`);
  const remote = `cd ${shellQuote(path)} && exec "\${SHELL:-sh}" -l`;
  return [...sshProgram(env), "-t", ...options, "--", entry.dest, remote];
}
