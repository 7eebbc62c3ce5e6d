// Typed errors. A daemon error carries `code`, `kind` (data.kind: what a client branches on),
// `message` and `data`; client-side failures (no daemon, a lost connection, a timeout) are their
// own classes so a caller can tell "the daemon said no" from "the daemon never answered".

import { ERROR_CODES, type ErrorKind, type HolderInfo } from "./generated/protocol.js";

/** Anything this client throws. */
export class XumClientError extends Error {
  override name = "XumClientError";
}

/** Nothing answers on the socket (no file, a stale socket, or a refused connection). */
export class DaemonNotRunning extends XumClientError {
  override name = "DaemonNotRunning";
  constructor(
    readonly socketPath: string,
    readonly reason: string,
  ) {
    super(`no daemon at ${socketPath}; start it with \`xum daemon run\` or the systemd unit (${reason})`);
  }
}

/**
 * The connection closed (or broke) before the answer came. For a call, `sent` says which: true,
 * the request went out and no answer came (the daemon may or may not have done it: it finishes
 * or rolls back on its own); false, it never went out (the daemon never saw it: nothing ran).
 * The message says the same, naming the call (`method`).
 */
export class ConnectionLost extends XumClientError {
  override name = "ConnectionLost";
  /** The call this error ended (undefined: not about one call). */
  readonly method: string | undefined;
  /** Whether its request went out (undefined: not about one call). */
  readonly sent: boolean | undefined;

  constructor(message: string, call?: { method: string; sent: boolean }) {
    super(message);
    this.method = call?.method;
    this.sent = call?.sent;
  }

  /** The error of `method` when the connection ended (`reason`) before its answer. */
  static during(method: string, sent: boolean, reason: string): ConnectionLost {
    const message = sent
      ? `${method} was sent and the connection was lost before its answer (${reason}): the daemon ` +
        "may or may not have done it (it finishes or rolls back on its own); look before retrying"
      : `${method} was not sent: the connection was lost before the request went out (${reason}); ` +
        "the daemon never saw it";
    return new ConnectionLost(message, { method, sent });
  }
}

/** No answer within the call's timeout (the daemon may still run the call). */
export class ClientTimeout extends XumClientError {
  override name = "ClientTimeout";
  constructor(
    readonly method: string,
    readonly timeoutMs: number,
  ) {
    super(`no answer to ${method} within ${timeoutMs} ms`);
  }
}

/** The daemon is not reading this connection's requests: the call was not sent. */
export class Backpressure extends XumClientError {
  override name = "Backpressure";
}

/**
 * The daemon's xum release differs from this client's in major.minor (`hello`'s
 * `server.version`; one it cannot read counts as different): raised by the client right after the
 * handshake, never sent by a daemon. The same kind and message as the Python client's.
 */
export class VersionMismatch extends XumClientError {
  override name = "VersionMismatch";
  readonly kind = "version_mismatch";
  readonly data: { client_version: string; server_version: string; where: string };

  constructor(
    readonly clientVersion: string,
    readonly serverVersion: string,
    where: string,
    hint: string,
  ) {
    super(
      `this client is xum ${clientVersion} but the daemon ${where} is xumd ${serverVersion}: ` +
        `their versions differ (major.minor); ${hint}`,
    );
    this.data = { client_version: clientVersion, server_version: serverVersion, where };
  }
}

/** The client was closed. */
export class ClientClosed extends XumClientError {
  override name = "ClientClosed";
}

/** A JSON-RPC error object from the daemon. */
export interface ErrorObject {
  code: number;
  message: string;
  data?: unknown;
}

const KIND_BY_CODE = new Map<number, ErrorKind>(
  Object.entries(ERROR_CODES).map(([kind, code]) => [code, kind as ErrorKind]),
);

/**
 * An error answered by the daemon. `kind` is `data.kind`; for a daemon newer than this client it
 * may be a kind not in `ErrorKind` (then fall back on `code`, as the protocol says).
 */
export class XumRpcError extends XumClientError {
  override name = "XumRpcError";
  readonly code: number;
  readonly kind: ErrorKind | (string & {});
  readonly data: Record<string, unknown>;

  constructor(error: ErrorObject) {
    super(error.message);
    this.code = error.code;
    this.data =
      error.data !== null && typeof error.data === "object" && !Array.isArray(error.data)
        ? (error.data as Record<string, unknown>)
        : {};
    const kind = this.data["kind"];
    this.kind = typeof kind === "string" ? kind : (KIND_BY_CODE.get(error.code) ?? "unknown");
  }

  /** True when this error is of `kind` (by `data.kind`, else by code). */
  is(kind: ErrorKind): boolean {
    return this.kind === kind || (this.data["kind"] === undefined && ERROR_CODES[kind] === this.code);
  }

  /** The holders of a `busy` error (empty for any other error). */
  get holders(): HolderInfo[] {
    const holders = this.data["holders"];
    return Array.isArray(holders) ? (holders.filter(isHolder) as HolderInfo[]) : [];
  }
}

function isHolder(value: unknown): boolean {
  return value !== null && typeof value === "object" && typeof (value as { kind?: unknown }).kind === "string";
}

/** Narrows `err` to a daemon error of `kind`. */
export function isRpcError(err: unknown, kind?: ErrorKind): err is XumRpcError {
  return err instanceof XumRpcError && (kind === undefined || err.is(kind));
}

/**
 * A one-line description of a holder: `agent in pid 123 (label)`. A process picks its own name:
 * control characters in it (an escape sequence, a newline) are shown escaped (`\x1b`), never raw.
 */
export function describeHolder(holder: HolderInfo & { workspace?: unknown }): string {
  let text = holder.pid === null ? holder.kind : `${holder.kind} in pid ${holder.pid}`;
  if (holder.label && holder.label !== holder.kind && holder.pid !== null) text += ` (${holder.label})`;
  else if (holder.pid === null && holder.label) text = holder.label;
  if (typeof holder.workspace === "string") text += ` [${holder.workspace}]`;
  return printable(text);
}

/** `text` with its control characters escaped as `\xNN`. */
function printable(text: string): string {
  return text.replace(/[\u0000-\u001f\u007f-\u009f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`);
}
