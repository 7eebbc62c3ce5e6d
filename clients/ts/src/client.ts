// The connection to xumd: JSON-RPC 2.0 over a Unix socket, one JSON text per line.
//
// - `hello` on every (re)connection; the answer is `client.server`.
// - Requests carry ids and run concurrently; each has its own timeout. Answers are matched by id.
// - When the connection breaks, the calls in flight fail with `ConnectionLost` (they may or may
//   not have run), and the client reconnects with exponential backoff. A call made while
//   disconnected waits for the reconnection, within its own timeout. The one exception: a
//   mutating call carries a request key (the caller's `request_key`, else a new one), and when
//   its answer was lost after it was sent it is sent once more with that key, within its
//   timeout: the daemon answers the first call's outcome instead of doing it twice
//   (docs/PROTOCOL.md, "Request keys"; `retryLost: false` turns it off).
// - An event subscription survives reconnects: the client resubscribes with the last `seq` and
//   `epoch` it saw, so the daemon replays what was missed; when it cannot (`resync_required`, or
//   another daemon run), the new snapshot is delivered as a `snapshot` and the stream goes on.
//   A position saved by an earlier process resumes the same way (`subscribe({ resumeFrom })`).

import { randomUUID } from "node:crypto";
import { EventEmitter } from "node:events";
import { createConnection, type Socket } from "node:net";
import type { Duplex } from "node:stream";

import { resolveSocket, type Env } from "./discovery.js";
import { checkEntry, getHost, HostLink, type HostEntry } from "./hosts.js";
import {
  ClientClosed,
  Backpressure,
  ClientTimeout,
  ConnectionLost,
  DaemonNotRunning,
  XumClientError,
  VersionMismatch,
  XumRpcError,
  type ErrorObject,
} from "./errors.js";
import { encodeFrame, FrameTooLong, LineDecoder } from "./framing.js";
import { DEFAULT_PAGE } from "./paging.js";
import {
  MUTATING_METHODS,
  PROTOCOL_VERSION,
  type HelloResult,
  type MethodName,
  type Params,
  type RawEvent,
  type Result,
} from "./generated/protocol.js";

/** This client's xum release (the Python client's `CLIENT_VERSION`: a test keeps them equal). */
export const CLIENT_VERSION = "0.1.0";

const LOCAL_HINT =
  "restart the daemon from this installation (`xum daemon stop`, then start it again), or use " +
  "the xum that matches it";

/** `major.minor` of a release string ("0.1.0", "1.2.3rc1"), null when it does not start with two numbers. */
export function releaseLine(version: string): [number, number] | null {
  const match = /^(\d{1,6})\.(\d{1,6})(?:\D|$)/.exec(version);
  return match ? [Number(match[1]), Number(match[2])] : null;
}

/**
 * Throws VersionMismatch unless `hello`'s `server.version` has `mine`'s major.minor (the Python
 * client's `check_release`): patch releases mix freely; a version that cannot be read is a
 * mismatch, the client cannot vouch for what it does not know.
 */
export function checkRelease(server: HelloResult, where: string, hint: string, mine: string = CLIENT_VERSION): void {
  const info = (server as { server?: unknown }).server;
  const raw = info !== null && typeof info === "object" ? (info as { version?: unknown }).version : undefined;
  const theirs = typeof raw === "string" && raw ? raw : "(unknown version)";
  const a = releaseLine(theirs);
  const b = releaseLine(mine);
  if (a === null || b === null || a[0] !== b[0] || a[1] !== b[1]) throw new VersionMismatch(mine, theirs, where, hint);
}

export interface ReconnectOptions {
  /** First delay after a lost connection, ms (default 100). */
  initialDelayMs?: number;
  /** Upper bound of the delay, ms (default 5000). */
  maxDelayMs?: number;
  /** Growth per failed attempt (default 2). */
  factor?: number;
  /** Random spread of each delay, a fraction (default 0.2): many clients do not retry in step. */
  jitter?: number;
}

export interface ClientOptions {
  /** The socket; default: discovery (`XUM_SOCKET`, `$XUM_ROOT/xumd.sock`, the default root). */
  socketPath?: string;
  /**
   * A host (docs/HOSTS.md): a name from the hosts file, or an entry. The client then runs
   * `ssh ... xum bridge` and speaks over its pipes; `root` and `socketPath` name the host's. A host
   * that cannot be reached is a `HostError` (`HostUnreachable`, `HostKeyRefused`,
   * `XumMissingOnHost`, `BridgeFailed`); a connection that drops during calls fails them with
   * `HostConnectionLost` (outcome unknown). Reconnecting follows the same rule as locally.
   */
  host?: string | HostEntry;
  /** A root whose socket to use (`ROOT/xumd.sock`), when no `socketPath` is given. */
  root?: string;
  /** The environment discovery reads (default `process.env`). */
  env?: Env;
  clientName?: string;
  /**
   * The xum release this client is (default `CLIENT_VERSION`): sent in `hello` and compared with
   * the daemon's (`checkVersion`).
   */
  clientVersion?: string;
  /** The protocol version sent in `hello` (default: the one the types were generated from). */
  protocol?: string;
  /** Default per-call timeout, ms (default 60000). */
  timeoutMs?: number;
  /** Bound on connect + `hello`, ms (default 5000). */
  connectTimeoutMs?: number;
  /**
   * Reconnect after a lost connection, in the background with backoff (default: on). When off,
   * a call made while disconnected makes one connection attempt and fails with its reason.
   */
  reconnect?: boolean | ReconnectOptions;
  /**
   * After `hello`, refuse a daemon of another xum major.minor with `VersionMismatch` (default:
   * on); off only for what must reach any daemon (a status or stop command).
   */
  checkVersion?: boolean;
  /** Longest frame accepted from the daemon, bytes (default 64 MiB). */
  maxFrameBytes?: number;
  /**
   * Send a mutating call once more, with its request key, when its answer was lost after it was
   * sent (`ConnectionLost` with `sent`): the daemon answers the first call's outcome (default:
   * on). Off: such a call fails with that `ConnectionLost`.
   */
  retryLost?: boolean;
  /**
   * Bytes of requests queued to a daemon that is not reading them, beyond which a call fails at
   * once with `Backpressure` instead of queueing more (default 16 MiB).
   */
  maxQueuedBytes?: number;
}

export interface CallOptions {
  /** This call's timeout, ms (default: the client's). */
  timeoutMs?: number;
}

/** `params` may be left out when every field of the method's params is optional. */
export type CallArgs<M extends MethodName> =
  Record<string, never> extends Params<M>
    ? [params?: Params<M>, options?: CallOptions]
    : [params: Params<M>, options?: CallOptions];

export interface SubscribeOptions {
  /** Only these event types (prefix match, e.g. `workspace.`); default all. */
  types?: string[];
  /**
   * The snapshot's workspaces are fetched this many per answer (`snapshot_limit`, then
   * `workspace.list` pages on the same connection; default `DEFAULT_PAGE`, 500; 1 to 10,000): a
   * root of any size never makes one answer that passes a frame cap. The `snapshot` emitted is
   * whole all the same, and events follow it. 0: the whole snapshot in one answer.
   */
  snapshotPage?: number;
  /**
   * Resume from a position saved earlier (`client.position`, in this process or another one):
   * the daemon replays the events after it, delivered as `event` with no snapshot, and
   * `subscribe()` answers a `ResumeInfo`. When it cannot (another daemon run, a gap its ring no
   * longer holds) a `snapshot` comes instead (`epoch_changed`, `resync`), as after a reconnect.
   * Listen for `event` before subscribing: the replayed events are delivered before
   * `subscribe()`'s answer reaches its caller. Null: none (a plain subscription).
   */
  resumeFrom?: Position | null;
}

/** Where a subscription stands: the daemon run (`epoch`) and the `seq` of the last event applied. */
export interface Position {
  epoch: string;
  seq: number;
}

/** `subscribe()`'s answer when it resumed from `resumeFrom`: the events after `seq` follow. */
export interface ResumeInfo {
  reason: "resumed";
  epoch: string;
  /** The position resumed from. */
  seq: number;
}

/** Why a snapshot was delivered. */
export type SnapshotReason =
  /** The first subscription. */
  | "initial"
  /** The daemon could no longer replay what was missed (`resync_required`). */
  | "resync"
  /** Another daemon run (a restart): sequence numbers started over. */
  | "epoch_changed";

export interface SnapshotInfo {
  reason: SnapshotReason;
  epoch: string;
  seq: number;
  snapshot: Record<string, unknown>;
}

export interface ClientEvents {
  /** Connected and `hello` answered (again, after a reconnect). */
  connect: [server: HelloResult];
  /** The connection was lost (a reconnect follows when enabled). */
  disconnect: [reason: Error];
  /**
   * One event of the subscription, in order, never twice: the envelope, whatever its type (a
   * newer daemon may send types this client does not know); `isEvent(e, "workspace.updated")`
   * narrows it to a known type with typed `data`.
   */
  event: [event: RawEvent];
  /** A snapshot: the state at `seq`, after which events follow. */
  snapshot: [info: SnapshotInfo];
  /**
   * A connection attempt failed (no daemon, a failed `hello` or resubscription); the next attempt
   * is in `retryInMs`, or never (null: reconnecting is off, or cannot help, as for
   * `protocol_mismatch`). Not named `error`: that name would throw without a listener and make
   * `events.once(client, ...)` reject.
   */
  connect_failed: [error: Error, retryInMs: number | null];
}

interface Pending {
  method: string;
  /** The request went out (its write was handed to the socket): its outcome is then unknown. */
  sent: boolean;
  resolve: (result: Record<string, unknown>) => void;
  reject: (error: Error) => void;
  timer: NodeJS.Timeout;
}

interface Subscription {
  types: string[] | undefined;
  /** `snapshot_limit` (0: none). */
  page: number;
  epoch: string | null;
  /** The last seq delivered (or the snapshot's); events at or below it are duplicates. */
  seq: number | null;
  /** Events that arrived while a subscribe call was in flight, delivered after its answer. */
  held: RawEvent[] | null;
  /**
   * False after a connection was dropped for a frame over the client's cap: resuming would replay
   * that same event and drop the connection again, forever; the next subscription takes a fresh
   * snapshot instead (which stands for the event).
   */
  resumable: boolean;
  /** Settles the first `subscribe()` call: its snapshot (or resumption), or why it failed. */
  first: { resolve: (info: SnapshotInfo | ResumeInfo) => void; reject: (err: Error) => void } | null;
}

/** What a snapshot page is fetched over: the subscribed connection. */
export interface SnapshotConn {
  call(method: string, params: unknown, timeoutMs: number): Promise<Record<string, unknown>>;
}

function isFirstAnswer(value: unknown): value is SnapshotInfo | ResumeInfo {
  return !(value instanceof Error) && value !== null && typeof value === "object" && "reason" in value && "epoch" in value;
}

/** One socket. A reconnect makes a new one, so a stale socket's close never touches the new. */
class Conn {
  readonly pending = new Map<number, Pending>();
  /** The ssh transport of a host connection (null: a local socket). */
  link: HostLink | null = null;
  private nextId = 1;
  private decoder: LineDecoder;
  private nullError: XumRpcError | null = null;
  /** This side ended the connection (close, or a frame it could not take). */
  private endedByUs = false;
  closed = false;

  constructor(
    readonly sock: Duplex,
    maxFrameBytes: number,
    private readonly maxQueuedBytes: number,
    private readonly onNotification: (message: Record<string, unknown>) => void,
    private readonly onClose: (conn: Conn, reason: Error) => void,
  ) {
    this.decoder = new LineDecoder(maxFrameBytes);
    sock.on("data", (chunk: Buffer) => this.receive(chunk));
    sock.on("error", () => {
      // 'close' follows and carries the failure to the callers.
    });
    sock.on("close", () =>
      this.finish(
        this.nullError ??
          new ConnectionLost(this.endedByUs ? "this client closed the connection" : "the daemon closed the connection"),
      ),
    );
  }

  call(method: string, params: unknown, timeoutMs: number): Promise<Record<string, unknown>> {
    if (this.closed) return Promise.reject(ConnectionLost.during(method, false, "the connection is closed"));
    // A daemon that stopped reading (wedged, or holding this connection's requests in flight)
    // must not make this process buffer every later request: a timed-out call's bytes stay
    // queued, so timeouts alone do not bound it.
    if (this.sock.writableLength > this.maxQueuedBytes) {
      return Promise.reject(
        new Backpressure(`${method}: the daemon is not reading (${this.sock.writableLength} bytes queued to it)`),
      );
    }
    const id = this.nextId++;
    const message: Record<string, unknown> = { jsonrpc: "2.0", id, method };
    if (params !== undefined) message["params"] = params;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        // A late answer to this id is dropped (its entry is gone).
        this.pending.delete(id);
        reject(new ClientTimeout(method, timeoutMs));
      }, timeoutMs);
      const entry: Pending = { method, sent: false, resolve, reject, timer };
      this.pending.set(id, entry);
      // Called once the bytes are handed to the kernel. When the connection ends first (behind
      // a daemon that stopped reading, say) it is called too, with an error or, for a write
      // under way, with none but on a destroyed socket: then the request was not sent.
      this.sock.write(encodeFrame(message), (err) => {
        if ((err === null || err === undefined) && !this.sock.destroyed) entry.sent = true;
      });
    });
  }

  close(): void {
    this.endedByUs = true;
    this.sock.destroy();
  }

  /** Close, and settle once the socket is gone (destroying it always ends in 'close'). */
  closeAndWait(): Promise<void> {
    const gone = new Promise<void>((resolve) => this.sock.once("close", () => resolve()));
    this.close();
    return gone;
  }

  private receive(chunk: Buffer): void {
    let lines: string[];
    try {
      lines = this.decoder.push(chunk);
    } catch (err) {
      if (err instanceof FrameTooLong) {
        this.fail(new FrameTooLongLost(`the daemon sent a frame too long (${err.message})`));
        return;
      }
      throw err;
    }
    for (const line of lines) {
      let message: unknown;
      try {
        message = JSON.parse(line);
      } catch {
        this.fail(new ConnectionLost(`the daemon sent something that is not JSON: ${line.slice(0, 200)}`));
        return;
      }
      this.dispatch(message);
      if (this.closed) return;
    }
  }

  private dispatch(message: unknown): void {
    if (message === null || typeof message !== "object" || Array.isArray(message)) {
      // This client never sends batches, so an array is not an answer to it.
      this.fail(new ConnectionLost(`unexpected message from the daemon: ${JSON.stringify(message).slice(0, 200)}`));
      return;
    }
    const msg = message as Record<string, unknown>;
    if (typeof msg["method"] === "string" && !("id" in msg)) {
      this.onNotification(msg);
      return;
    }
    const id = msg["id"];
    if (id === null && isErrorObject(msg["error"])) {
      // The daemon could not read a request of ours (e.g. a frame too large); it names no id,
      // and closes the connection next: every call in flight fails with this error.
      this.nullError = new XumRpcError(msg["error"]);
      return;
    }
    if (typeof id !== "number") return;
    const pending = this.pending.get(id);
    if (pending === undefined) return; // timed out already
    this.pending.delete(id);
    clearTimeout(pending.timer);
    if (isErrorObject(msg["error"])) {
      pending.reject(new XumRpcError(msg["error"]));
    } else if (msg["result"] !== null && typeof msg["result"] === "object" && !Array.isArray(msg["result"])) {
      pending.resolve(msg["result"] as Record<string, unknown>);
    } else {
      pending.reject(new ConnectionLost(`a result must be an object, got ${JSON.stringify(msg["result"])}`));
    }
  }

  private fail(reason: Error): void {
    this.endedByUs = true;
    this.finish(reason);
    this.sock.destroy();
  }

  private finish(reason: Error): void {
    if (this.closed) return;
    this.closed = true;
    // Ended from this side, the oldest request not yet sent may be partly written: the daemon
    // then reads what came and the end of input, and a frame cut only before its newline is a
    // whole request it runs. Its outcome is unknown; never say it was not sent.
    let partly = this.endedByUs;
    for (const [id, pending] of this.pending) {
      this.pending.delete(id);
      clearTimeout(pending.timer);
      const sent = pending.sent || partly;
      if (!pending.sent) partly = false;
      pending.reject(
        reason instanceof XumRpcError
          ? reason
          : this.link !== null
            ? this.link.lost(pending.method, sent)
            : ConnectionLost.during(pending.method, sent, reason.message),
      );
    }
    this.onClose(this, reason);
  }
}

function isPosition(value: unknown): value is Position {
  if (value === null || typeof value !== "object") return false;
  const { epoch, seq } = value as { epoch?: unknown; seq?: unknown };
  return typeof epoch === "string" && epoch !== "" && Number.isSafeInteger(seq) && (seq as number) >= 0;
}

const MUTATING: ReadonlySet<string> = new Set(MUTATING_METHODS);

/**
 * `params` of a mutating method with a request key (a new one unless they hold one already): a
 * new object, or `params` itself when the method is a read or they are not an object.
 */
export function withRequestKey(method: string, params: unknown): unknown {
  if (!MUTATING.has(method) || params === null || typeof params !== "object" || Array.isArray(params)) return params;
  const given = params as Record<string, unknown>;
  return { ...given, request_key: typeof given["request_key"] === "string" ? given["request_key"] : randomUUID() };
}

/** The connection was dropped because the daemon sent a frame over the client's cap. */
class FrameTooLongLost extends ConnectionLost {}

function isErrorObject(value: unknown): value is ErrorObject {
  return (
    value !== null &&
    typeof value === "object" &&
    typeof (value as { code?: unknown }).code === "number" &&
    typeof (value as { message?: unknown }).message === "string"
  );
}

function openSocket(path: string, timeoutMs: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const sock = createConnection({ path });
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new DaemonNotRunning(path, `no answer to connect within ${timeoutMs} ms`));
    }, timeoutMs);
    sock.once("connect", () => {
      clearTimeout(timer);
      sock.removeAllListeners("error");
      resolve(sock);
    });
    sock.once("error", (err: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      sock.destroy();
      if (err.code === "ENOENT") reject(new DaemonNotRunning(path, `no socket at ${path}`));
      else if (err.code === "ECONNREFUSED") reject(new DaemonNotRunning(path, "stale socket"));
      else if (err.code === "EACCES") {
        reject(new XumClientError(`permission denied on ${path}: the daemon belongs to another user`));
      } else reject(new DaemonNotRunning(path, err.message));
    });
  });
}

type State = "idle" | "connecting" | "connected" | "waiting" | "closed";

export class XumClient extends EventEmitter<ClientEvents> {
  /** The socket (for a host: `ssh:NAME`, the host's socket being the bridge's business). */
  readonly socketPath: string;
  /** The host this client reaches through ssh (null: the local daemon). */
  readonly host: HostEntry | null;
  private readonly hostRoot: string | undefined;
  private readonly hostSocket: string | undefined;
  private readonly env: Env;
  /** The last `hello` answer (null before the first connection). */
  server: HelloResult | null = null;

  private readonly options: Required<Omit<ClientOptions, "socketPath" | "root" | "env" | "reconnect" | "host">>;
  private readonly backoff: Required<ReconnectOptions> | null;
  private conn: Conn | null = null;
  private state: State = "idle";
  private attempt = 0;
  private retryTimer: NodeJS.Timeout | null = null;
  private lastFailure: Error | null = null;
  private waiters = new Set<() => void>();
  private subscription: Subscription | null = null;
  private connecting: Promise<void> | null = null;
  /** A connection still in its `hello`/resubscription, so that close() can end it too. */
  private opening: Conn | null = null;

  constructor(options: ClientOptions = {}) {
    super();
    this.env = options.env ?? process.env;
    if (options.host !== undefined) {
      this.host = typeof options.host === "string" ? getHost(options.host, this.env) : checkEntry(options.host);
      this.hostRoot = options.root;
      this.hostSocket = options.socketPath;
      this.socketPath = `ssh:${this.host.name}`;
    } else {
      this.host = null;
      this.socketPath = resolveSocket(options.env, undefined, { socket: options.socketPath, root: options.root }).path;
    }
    this.options = {
      clientName: options.clientName ?? "xum-ts",
      clientVersion: options.clientVersion ?? CLIENT_VERSION,
      protocol: options.protocol ?? PROTOCOL_VERSION,
      timeoutMs: options.timeoutMs ?? 60_000,
      connectTimeoutMs: options.connectTimeoutMs ?? 5_000,
      maxFrameBytes: options.maxFrameBytes ?? 64 * 1024 * 1024,
      maxQueuedBytes: options.maxQueuedBytes ?? 16 * 1024 * 1024,
      checkVersion: options.checkVersion ?? true,
      retryLost: options.retryLost ?? true,
    };
    const reconnect = options.reconnect ?? true;
    this.backoff =
      reconnect === false
        ? null
        : {
            initialDelayMs: 100,
            maxDelayMs: 5_000,
            factor: 2,
            jitter: 0.2,
            ...(reconnect === true ? {} : reconnect),
          };
  }

  /**
   * A connected client: the first attempt must succeed (else `DaemonNotRunning`, ...). When it
   * fails the client is closed before the rejection: the caller never holds it, so nothing of it
   * (a retry timer, a connection) may keep the process alive.
   */
  static async connect(options: ClientOptions = {}): Promise<XumClient> {
    const client = new XumClient(options);
    try {
      await client.open();
    } catch (err) {
      await client.close();
      throw err;
    }
    return client;
  }

  get connected(): boolean {
    return this.state === "connected";
  }

  /** The pid of the ssh process carrying a host connection (null: local, or not connected). */
  get transportPid(): number | null {
    return this.conn?.link?.pid ?? null;
  }

  /**
   * One connection attempt now; throws why it failed. With reconnecting on, the failure leaves
   * the client retrying in the background (as `start` does) until it connects or is closed.
   */
  async open(): Promise<void> {
    if (this.state === "closed") throw new ClientClosed("the client is closed");
    if (this.state === "connected") return;
    await this.attemptConnect();
  }

  /** Connect in the background, retrying with backoff until connected or closed. */
  start(): void {
    if (this.state !== "idle") return;
    void this.attemptConnect().catch(() => {
      // attemptConnect scheduled the retry and emitted the error.
    });
  }

  /** Resolves when connected; rejects after `timeoutMs` with why the last attempt failed. */
  waitConnected(timeoutMs: number = this.options.timeoutMs): Promise<void> {
    return new Promise((resolve, reject) => {
      // Woken on every change of state (and looked at once now); settles on connected, closed,
      // or no retry to come.
      const done = (): void => {
        if (this.state === "connected") settle(null);
        else if (this.state === "closed") settle(new ClientClosed("the client is closed"));
        else if (this.backoff === null && this.state !== "connecting") {
          settle(this.lastFailure ?? new DaemonNotRunning(this.socketPath, "not connected"));
        }
      };
      const settle = (error: Error | null): void => {
        clearTimeout(timer);
        this.waiters.delete(done);
        if (error === null) resolve();
        else reject(error);
      };
      const timer = setTimeout(() => {
        settle(this.lastFailure ?? new DaemonNotRunning(this.socketPath, `not connected within ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiters.add(done);
      done();
    });
  }

  /** Call `method`; the result, or the daemon's error as `XumRpcError`. */
  async call<M extends MethodName>(method: M, ...args: CallArgs<M>): Promise<Result<M>> {
    const [params, options] = args;
    return (await this.callRaw(method, params ?? {}, options)) as unknown as Result<M>;
  }

  /**
   * An untyped call, for methods newer than this client's generated types. A mutating call is
   * named by a request key and sent once more after a lost answer (see the top of this file).
   */
  async callRaw(method: string, params?: unknown, options: CallOptions = {}): Promise<Record<string, unknown>> {
    const timeoutMs = options.timeoutMs ?? this.options.timeoutMs;
    const deadline = Date.now() + timeoutMs;
    const keyed = withRequestKey(method, params);
    try {
      return await this.callOnce(method, keyed, deadline);
    } catch (err) {
      const again = this.options.retryLost && keyed !== params && err instanceof ConnectionLost && err.sent === true;
      if (!again || Date.now() >= deadline) throw err;
      return this.callOnce(method, keyed, deadline).catch((later: unknown) => {
        // No daemon to ask again: the first call's outcome stays unknown, as it said.
        throw later instanceof DaemonNotRunning ? err : later;
      });
    }
  }

  private async callOnce(method: string, params: unknown, deadline: number): Promise<Record<string, unknown>> {
    const timeoutMs = Math.max(1, deadline - Date.now());
    if (this.state !== "connected") {
      if (this.state === "idle") this.start();
      await this.waitConnected(timeoutMs).catch((err: unknown) => {
        throw err instanceof Error ? err : new DaemonNotRunning(this.socketPath, String(err));
      });
    }
    const conn = this.conn;
    if (conn === null) throw ConnectionLost.during(method, false, "the connection was lost");
    return conn.call(method, params, Math.max(1, deadline - Date.now()));
  }

  /**
   * Subscribe to events (one subscription per client). The first answer's snapshot is returned
   * and also emitted as `snapshot`; events follow as `event`, across reconnects, each once and in
   * order. With `resumeFrom`, the answer is a `ResumeInfo` when the daemon could replay from there.
   */
  subscribe(options?: SubscribeOptions & { resumeFrom?: null }): Promise<SnapshotInfo>;
  subscribe(options: SubscribeOptions): Promise<SnapshotInfo | ResumeInfo>;
  async subscribe(options: SubscribeOptions = {}): Promise<SnapshotInfo | ResumeInfo> {
    if (this.subscription !== null) throw new XumClientError("already subscribed (one subscription per client)");
    if (this.state === "closed") throw new ClientClosed("the client is closed");
    let settle: { resolve: (info: SnapshotInfo | ResumeInfo) => void; reject: (err: Error) => void } | null = null;
    const first = new Promise<SnapshotInfo | ResumeInfo>((resolve, reject) => {
      settle = { resolve, reject };
    });
    const page = options.snapshotPage ?? DEFAULT_PAGE;
    if (!Number.isInteger(page) || page < 0 || page > 10_000) {
      throw new XumClientError(`snapshotPage must be an integer from 0 to 10000, got ${page}`);
    }
    const from = options.resumeFrom ?? undefined;
    if (from !== undefined && !isPosition(from)) {
      throw new XumClientError(
        `resumeFrom must be { epoch: a non-empty string, seq: an integer >= 0 } (a saved \`position\`), got ${JSON.stringify(from)}`,
      );
    }
    const sub: Subscription = {
      types: options.types,
      page,
      epoch: from?.epoch ?? null,
      seq: from?.seq ?? null,
      held: null,
      resumable: true,
      first: settle,
    };
    this.subscription = sub;
    const conn = this.state === "connected" ? this.conn : null;
    if (conn !== null) {
      // Connected: subscribe now. Otherwise the (re)connection subscribes before it is up.
      this.resubscribe(conn).catch((err: unknown) => this.settleFirst(sub, err));
    } else if (this.state === "idle") {
      this.start();
    }
    const timer = setTimeout(() => {
      this.settleFirst(sub, this.lastFailure ?? new DaemonNotRunning(this.socketPath, "not connected"));
    }, this.options.timeoutMs);
    try {
      return await first;
    } catch (err) {
      if (this.subscription === sub) this.subscription = null;
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }

  private settleFirst(sub: Subscription, outcome: SnapshotInfo | ResumeInfo | unknown): void {
    const first = sub.first;
    if (first === null) return;
    sub.first = null;
    if (isFirstAnswer(outcome)) first.resolve(outcome);
    else first.reject(outcome instanceof Error ? outcome : new XumClientError(String(outcome)));
  }

  /** Stop receiving events (the daemon ends a subscription with its connection: reconnect). */
  unsubscribe(): void {
    if (this.subscription === null) return;
    this.subscription = null;
    this.conn?.close();
  }

  /**
   * The subscription's position: the epoch and last seq delivered (null before any). Saved (it is
   * plain JSON), it is what `subscribe({ resumeFrom })` takes, in this process or a later one.
   */
  get position(): { epoch: string | null; seq: number | null } | null {
    return this.subscription === null ? null : { epoch: this.subscription.epoch, seq: this.subscription.seq };
  }

  /**
   * Drop the connection but not the client: with reconnecting on, it reconnects (and resumes the
   * subscription); otherwise the next `open()` or call does.
   */
  async disconnect(): Promise<void> {
    const conn = this.conn;
    if (conn === null || conn.closed) return;
    await conn.closeAndWait();
  }

  /** Close the connection and stop reconnecting. Calls in flight fail with `ConnectionLost`. */
  async close(): Promise<void> {
    if (this.state === "closed") return;
    this.state = "closed";
    if (this.retryTimer !== null) clearTimeout(this.retryTimer);
    this.retryTimer = null;
    const conns = [this.conn, this.opening].filter((c): c is Conn => c !== null && !c.closed);
    this.conn = null;
    this.opening = null;
    await Promise.all(conns.map((conn) => conn.closeAndWait()));
    this.wake();
  }

  private wake(): void {
    for (const waiter of [...this.waiters]) waiter();
  }

  private attemptConnect(): Promise<void> {
    if (this.connecting !== null) return this.connecting;
    this.state = "connecting";
    this.connecting = this.connectOnce()
      .then(() => {
        this.attempt = 0;
        this.lastFailure = null;
        this.wake();
        if (this.server !== null) this.emit("connect", this.server);
      })
      .catch((err: unknown) => {
        const error = err instanceof Error ? err : new Error(String(err));
        this.lastFailure = error;
        if (this.state !== "closed") {
          this.state = "waiting";
          // No retry to come (reconnecting off, or a protocol mismatch): idle, so that the next
          // call or open() makes a new attempt instead of failing forever on this one's reason.
          if (!this.scheduleRetry(error)) {
            this.state = "idle";
            // No retry to come: a first subscribe() waiting on this connection fails now with
            // its reason, not at its timeout.
            if (this.subscription !== null) this.settleFirst(this.subscription, error);
          }
        }
        this.wake();
        throw error;
      })
      .finally(() => {
        this.connecting = null;
      });
    return this.connecting;
  }

  private async connectOnce(): Promise<void> {
    const link = this.host !== null ? HostLink.open(this.host, this.env, this.hostRoot, this.hostSocket) : null;
    const sock = link !== null ? link.stream : await openSocket(this.socketPath, this.options.connectTimeoutMs);
    if (this.state === "closed") {
      sock.destroy();
      throw new ClientClosed("the client is closed");
    }
    const conn = new Conn(
      sock,
      this.options.maxFrameBytes,
      this.options.maxQueuedBytes,
      (message) => this.onNotification(conn, message),
      (closed, reason) => this.onConnClosed(closed, reason),
    );
    conn.link = link;
    this.opening = conn;
    try {
      const hello = await conn.call(
        "hello",
        { protocol: this.options.protocol, client: { name: this.options.clientName, version: this.options.clientVersion } },
        this.options.connectTimeoutMs,
      );
      // Closed while `hello` was under way: close() could not see this connection yet.
      if ((this.state as State) === "closed") throw new ClientClosed("the client is closed");
      if (this.options.checkVersion) {
        const [where, hint] = this.releaseContext(hello as unknown as HelloResult);
        checkRelease(hello as unknown as HelloResult, where, hint, this.options.clientVersion);
      }
      this.server = hello as unknown as HelloResult;
      this.conn = conn;
      this.state = "connected";
      if (this.subscription !== null) {
        // Resubscribe before anyone sees the connection as up, so no event is missed between.
        await this.resubscribe(conn);
      }
      this.opening = null;
    } catch (err) {
      if (this.conn === conn) this.conn = null;
      if (this.opening === conn) this.opening = null;
      if (this.state === "connected") this.state = "connecting";
      conn.close();
      if (link !== null && err instanceof ConnectionLost) {
        // ssh ended during hello (or the resubscription): its status says why; nothing that
        // changes anything ran on this connection.
        throw await link.failure();
      }
      throw err;
    }
  }

  /** Where the daemon runs and how to fix a mismatch (the Python client's `release_context`). */
  private releaseContext(hello: HelloResult): [string, string] {
    if (this.host === null) return [`on ${hello.root ?? this.socketPath}`, LOCAL_HINT];
    const name = this.host.name;
    const root = this.hostRoot ?? this.host.remoteRoot ?? "";
    return [
      `on host ${name}` + (root ? ` (${root})` : ""),
      `run \`xum host install ${name}\` to put this version there, then stop its daemon ` +
        `(\`xum --host ${name} daemon stop\`) so the next connection starts the new one`,
    ];
  }

  /** Schedules the next attempt; false when none will come. */
  private scheduleRetry(reason: Error): boolean {
    if (this.state === "closed") return false;
    if (
      this.backoff === null ||
      (reason instanceof XumRpcError && reason.is("protocol_mismatch")) ||
      reason instanceof VersionMismatch
    ) {
      // Retrying is off, or cannot help (another major version, or another release, answers
      // on this socket: someone must restart it first).
      this.emit("connect_failed", reason, null);
      return false;
    }
    const b = this.backoff;
    const base = Math.min(b.maxDelayMs, b.initialDelayMs * b.factor ** this.attempt);
    const delay = Math.max(0, base * (1 + b.jitter * (2 * Math.random() - 1)));
    this.attempt += 1;
    this.emit("connect_failed", reason, Math.round(delay));
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      if (this.state === "waiting") {
        void this.attemptConnect().catch(() => {
          // rescheduled inside
        });
      }
    }, delay);
    return true;
  }

  private onConnClosed(conn: Conn, reason: Error): void {
    if (this.conn !== conn) return;
    this.conn = null;
    if (this.subscription !== null) {
      this.subscription.held = null;
      if (reason instanceof FrameTooLongLost) this.subscription.resumable = false;
    }
    if (this.state === "closed") return;
    this.state = "waiting";
    this.lastFailure = reason;
    this.emit("disconnect", reason);
    if (!this.scheduleRetry(reason)) this.state = "idle";
    this.wake();
  }

  /** Subscribe on `conn`, resuming from the last position when there is one. */
  private async resubscribe(conn: Conn): Promise<SnapshotInfo | null> {
    const sub = this.subscription;
    if (sub === null) return null;
    sub.held = [];
    const params: Record<string, unknown> = {};
    if (sub.types !== undefined) params["types"] = sub.types;
    const resuming = sub.epoch !== null && sub.seq !== null;
    if (resuming && sub.resumable) {
      params["after_seq"] = sub.seq;
      params["epoch"] = sub.epoch;
    }
    sub.resumable = true;
    if (sub.page > 0) params["snapshot_limit"] = sub.page;
    let result: Record<string, unknown>;
    for (;;) {
      try {
        result = await conn.call("events.subscribe", params, this.options.timeoutMs);
        break;
      } catch (err) {
        if (!(err instanceof XumRpcError && err.is("invalid_params"))) throw err;
        if ("snapshot_limit" in params) {
          // A daemon before 1.3 (no bounded snapshot): the whole snapshot in one answer.
          delete params["snapshot_limit"];
        } else if ("after_seq" in params) {
          // A daemon that cannot resume (before `after_seq`): a fresh snapshot instead.
          delete params["after_seq"];
          delete params["epoch"];
        } else {
          throw err;
        }
      }
    }
    if (this.subscription !== sub) return null;
    const epoch = String(result["epoch"]);
    const seq = Number(result["seq"]);
    let info: SnapshotInfo | null = null;
    const resynced = result["resync_required"] === true;
    if (!resuming || resynced || epoch !== sub.epoch || !("after_seq" in params)) {
      const reason: SnapshotReason = !resuming ? "initial" : epoch !== sub.epoch ? "epoch_changed" : "resync";
      const raw = result["snapshot"];
      const snapshot = raw !== null && typeof raw === "object" ? { ...(raw as Record<string, unknown>) } : {};
      // The rest of a bounded snapshot, page by page on this connection, events held meanwhile
      // (docs/PROTOCOL.md, "A bounded snapshot"). The position moves only once it is whole: a
      // connection lost between pages leaves the last complete one to resume from.
      const rest = result["workspaces_next"];
      if (rest !== undefined && rest !== null) {
        const first = Array.isArray(snapshot["workspaces"]) ? (snapshot["workspaces"] as unknown[]) : [];
        snapshot["workspaces"] = await this.snapshotRest(conn, first, rest, sub.page);
        if (this.subscription !== sub) return null;
      }
      sub.epoch = epoch;
      sub.seq = seq;
      info = { reason, epoch, seq, snapshot };
    }
    const held = sub.held ?? [];
    sub.held = null;
    if (info !== null) this.emit("snapshot", info);
    // Replayed events may come in the answer (`events`) or as notifications after it; either
    // way each is delivered once, in seq order.
    const replayed = Array.isArray(result["events"]) ? (result["events"] as RawEvent[]) : [];
    if (info !== null) this.settleFirst(sub, info);
    else if (sub.first !== null && sub.seq !== null) this.settleFirst(sub, { reason: "resumed", epoch, seq: sub.seq });
    for (const event of [...replayed, ...held]) this.deliver(sub, event);
    // A resumed answer's `seq` is where the live stream starts (a filtered replay may end before).
    if (sub.epoch === epoch && (sub.seq === null || seq > sub.seq) && info === null) sub.seq = seq;
    return info;
  }

  /** The workspaces after a bounded snapshot's first page: `workspace.list` from `after` to the end. */
  private async snapshotRest(conn: Conn, first: unknown[], after: unknown, page: number): Promise<unknown[]> {
    const workspaces = [...first];
    let cursor = after;
    while (cursor !== null && cursor !== undefined) {
      if (typeof cursor !== "string") {
        throw new XumClientError(`the snapshot's workspaces ended on a cursor that is none: ${JSON.stringify(cursor)}`);
      }
      const answer = await this.snapshotPage(conn, cursor, page);
      const listed = answer["workspaces"];
      if (!Array.isArray(listed)) throw new XumClientError("workspace.list answered no `workspaces`");
      workspaces.push(...(listed as unknown[]));
      const next = answer["next"] ?? null;
      // A cursor that does not advance would page for ever: never expected of a daemon.
      if (next === cursor) throw new XumClientError("workspace.list answered the same cursor twice");
      cursor = next;
    }
    return workspaces;
  }

  /** One page of a bounded snapshot's rest (a seam for tests that act between two pages). */
  protected snapshotPage(conn: SnapshotConn, after: string, limit: number): Promise<Record<string, unknown>> {
    return conn.call("workspace.list", { limit, after }, this.options.timeoutMs);
  }

  private onNotification(conn: Conn, message: Record<string, unknown>): void {
    if (message["method"] !== "event" || conn !== this.conn) return;
    const sub = this.subscription;
    const params = message["params"];
    if (sub === null || params === null || typeof params !== "object") return;
    const event = params as RawEvent;
    if (sub.held !== null) {
      sub.held.push(event);
      return;
    }
    this.deliver(sub, event);
  }

  private deliver(sub: Subscription, event: RawEvent): void {
    if (sub.epoch !== null && event.epoch !== sub.epoch) return; // another run's: superseded
    if (sub.seq !== null && event.seq <= sub.seq) return; // in the snapshot, or delivered
    sub.seq = event.seq;
    this.emit("event", event);
  }
}
