// The client the extension's settings ask for (no `vscode` import): the local daemon, or a
// host's through `ssh ... xum bridge` (docs/HOSTS.md), as the other xum clients reach one.

import type { ClientOptions } from "../../../ts/src/index.js";

export interface Settings {
  /** `xum.socketPath`: the daemon's socket (the host's, with `xum.host`); empty: discovery. */
  socketPath?: string | undefined;
  /** `xum.host`: a host from the hosts file (`xum host add NAME DEST`); empty: this machine. */
  host?: string | undefined;
}

export const CLIENT_NAME = "vscode-xum";

/** The options of the extension's client. A host name not in the hosts file throws when the client is made. */
export function clientOptions(settings: Settings): ClientOptions {
  const options: ClientOptions = { clientName: CLIENT_NAME };
  const host = settings.host?.trim();
  const socketPath = settings.socketPath?.trim();
  if (host) options.host = host;
  if (socketPath) options.socketPath = socketPath;
  return options;
}
