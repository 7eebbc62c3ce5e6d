// @xum/client: a TypeScript client for xumd. See README.md.
export * from "./generated/protocol.js";
export * from "./errors.js";
export * from "./discovery.js";
export * from "./hosts.js";
export { isEvent } from "./events.js";
export { encodeFrame, LineDecoder, FrameTooLong } from "./framing.js";
export { iterWorkspaces, DEFAULT_PAGE } from "./paging.js";
export {
  XumClient,
  CLIENT_VERSION,
  checkRelease,
  releaseLine,
  withRequestKey,
  type CallArgs,
  type CallOptions,
  type ClientEvents,
  type ClientOptions,
  type Position,
  type ReconnectOptions,
  type ResumeInfo,
  type SnapshotConn,
  type SnapshotInfo,
  type SnapshotReason,
  type SubscribeOptions,
} from "./client.js";
