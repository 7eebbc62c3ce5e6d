// Text for the tree, the status bar and error messages. No `vscode` import: tested in plain Node.

import {
  ClientTimeout,
  ConnectionLost,
  DaemonNotRunning,
  HostError,
  XumRpcError,
  describeHolder,
  type CleanupStatus,
  type ProjectInfo,
  type WorkspaceInfo,
} from "../../../ts/src/index.js";

/** `pending (attempt 2, next in 30 s): <last error>` and the like; null when there is nothing to say. */
export function describeCleanup(cleanup: CleanupStatus | null | undefined, now: number = Date.now() / 1000): string | null {
  if (cleanup === null || cleanup === undefined) return null;
  switch (cleanup.status) {
    case "completed":
      return "cleanup completed";
    case "not_needed":
      return null;
    case "failed":
      return `cleanup failed${cleanup.reason ? `: ${cleanup.reason}` : ""}`;
    case "pending": {
      let text = "cleanup pending";
      const parts: string[] = [];
      if (cleanup.attempts) parts.push(`attempt ${cleanup.attempts}`);
      if (typeof cleanup.next_attempt_at === "number") {
        const inS = Math.max(0, Math.round(cleanup.next_attempt_at - now));
        parts.push(`next in ${inS} s`);
      }
      if (parts.length > 0) text += ` (${parts.join(", ")})`;
      if (cleanup.last_error) text += `: ${cleanup.last_error}`;
      return text;
    }
    default:
      return `cleanup ${String(cleanup.status)}`;
  }
}

export interface WorkspaceLabel {
  label: string;
  description: string;
  tooltip: string;
  /** The context value menus match on: `workspace-<state>` plus `-cleanup` when cleanup is pending. */
  contextValue: string;
  /** A codicon name for the state. */
  icon: string;
}

const STATE_ICONS: Record<WorkspaceInfo["state"], string> = {
  creating: "loading~spin",
  active: "folder-active",
  archiving: "loading~spin",
  archived: "archive",
  restoring: "loading~spin",
  removing: "trash",
};

export function workspaceLabel(ws: WorkspaceInfo, now?: number): WorkspaceLabel {
  const cleanup = describeCleanup(ws.last_cleanup, now);
  const pending = ws.last_cleanup?.status === "pending";
  const bits: string[] = [ws.state];
  if (ws.interrupted) bits.push("interrupted");
  if (pending) bits.push("cleanup pending");
  else if (ws.last_cleanup?.status === "failed") bits.push("cleanup failed");
  const tooltip = [
    `${ws.name} (${ws.id})`,
    `state: ${ws.state}`,
    ws.branch ? `branch: ${ws.branch}` : null,
    `path: ${ws.path}`,
    cleanup,
    ws.interrupted ? `interrupted: ${ws.interrupted_reason ?? "see xum ws show"}` : null,
    ws.setup.status !== "none" && ws.setup.status !== "ok" ? `setup: ${ws.setup.status}` : null,
  ]
    .filter((line): line is string => line !== null)
    .join("\n");
  return {
    label: ws.name,
    description: bits.join(" · "),
    tooltip,
    contextValue: `workspace-${ws.state}${pending ? "-cleanup" : ""}`,
    icon: STATE_ICONS[ws.state] ?? "folder",
  };
}

export function projectLabel(project: ProjectInfo, workspaces: WorkspaceInfo[]): WorkspaceLabel {
  const active = workspaces.filter((w) => w.state === "active").length;
  const archived = workspaces.filter((w) => w.state === "archived").length;
  return {
    label: project.name,
    description: `${active} active${archived ? `, ${archived} archived` : ""}`,
    tooltip: `${project.name} (${project.id})\n${project.path}`,
    contextValue: "project",
    icon: "repo",
  };
}

/**
 * An error as the user should read it: the daemon's kind and message and, for `busy`, each holder
 * (kind, pid, label) and how to free it.
 */
export function formatError(err: unknown): string {
  if (err instanceof XumRpcError) {
    let text = `xum: ${err.kind}: ${err.message}`;
    const holders = err.holders;
    if (holders.length > 0) {
      text += ` — held by ${holders.map((h) => describeHolder(h)).join("; ")}`;
      text += ". Stop them (or archive with stop) and try again.";
    }
    return text;
  }
  if (err instanceof HostError) return `xum: ${err.kind}: ${err.message}`;
  if (err instanceof DaemonNotRunning) return `xum: the daemon is not running (${err.reason}): start it with \`xum daemon run\``;
  if (err instanceof ClientTimeout) return `xum: ${err.message}`;
  // The message says whether the call went out (it may or may not have run) or never did.
  if (err instanceof ConnectionLost) {
    if (err.sent === undefined) return `xum: connection lost (${err.message}); it may or may not have run`;
    return `xum: connection lost: ${err.message}`;
  }
  return `xum: ${err instanceof Error ? err.message : String(err)}`;
}

/**
 * The status bar: the workspace this window is in (and its cleanup), or the connection state;
 * `host` names the host the daemon runs on (null: this machine), `failure` why the last
 * connection attempt failed.
 */
export function statusBarText(
  connected: boolean,
  current: WorkspaceInfo | null,
  pendingCleanups: number,
  where: { host?: string | null; failure?: Error | null } = {},
): { text: string; tooltip: string } {
  const on = where.host ? ` on host ${where.host}` : "";
  if (!connected) {
    const why = where.failure ? `: ${where.failure.message}` : "";
    return { text: "$(debug-disconnect) xum", tooltip: `xum: not connected to the daemon${on}${why}` };
  }
  const cleanup = pendingCleanups > 0 ? ` $(sync~spin) ${pendingCleanups}` : "";
  if (current === null) {
    return {
      text: `$(layers) xum${cleanup}`,
      tooltip: pendingCleanups > 0 ? `xum: ${pendingCleanups} cleanup(s) pending${on}` : `xum: connected${on}`,
    };
  }
  return {
    text: `$(layers) ${current.name} · ${current.state}${cleanup}`,
    tooltip: workspaceLabel(current).tooltip,
  };
}
