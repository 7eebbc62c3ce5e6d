// What the tree shows, kept from the daemon's snapshot and its events (no `vscode` import).

import { isEvent, type ProjectInfo, type RawEvent, type WorkspaceInfo } from "../../../ts/src/index.js";

export class WorkspaceModel {
  readonly projects = new Map<string, ProjectInfo>();
  readonly workspaces = new Map<string, WorkspaceInfo>();

  /** Replace everything with a snapshot (`events.subscribe`'s `projects`/`workspaces`). */
  reset(snapshot: Record<string, unknown>): void {
    this.projects.clear();
    this.workspaces.clear();
    for (const p of asArray<ProjectInfo>(snapshot["projects"])) this.projects.set(p.id, p);
    for (const w of asArray<WorkspaceInfo>(snapshot["workspaces"])) this.workspaces.set(w.id, w);
  }

  /** Apply one event; true when the tree changed. Unknown types are ignored. */
  apply(event: RawEvent): boolean {
    if (isEvent(event, "project.added") || isEvent(event, "project.trusted")) {
      this.projects.set(event.data.project.id, event.data.project);
      return true;
    }
    if (isEvent(event, "project.removed")) {
      this.projects.delete(event.data.project_id);
      for (const [id, w] of this.workspaces) if (w.project_id === event.data.project_id) this.workspaces.delete(id);
      return true;
    }
    if (
      isEvent(event, "workspace.created") ||
      isEvent(event, "workspace.updated") ||
      isEvent(event, "workspace.state_changed") ||
      isEvent(event, "workspace.renamed") ||
      isEvent(event, "workspace.interrupted")
    ) {
      const ws = event.data.workspace;
      this.workspaces.set(ws.id, ws);
      return true;
    }
    if (isEvent(event, "workspace.removed")) {
      return this.workspaces.delete(event.data.workspace_id);
    }
    return false;
  }

  projectList(): ProjectInfo[] {
    return [...this.projects.values()].sort((a, b) => a.name.localeCompare(b.name));
  }

  workspacesOf(projectId: string): WorkspaceInfo[] {
    return [...this.workspaces.values()]
      .filter((w) => w.project_id === projectId)
      .sort((a, b) => a.name.localeCompare(b.name));
  }

  /** The workspace whose checkout holds `path` (the window's folder), if any. */
  workspaceAt(path: string | null): WorkspaceInfo | null {
    if (path === null) return null;
    let best: WorkspaceInfo | null = null;
    for (const w of this.workspaces.values()) {
      if (w.state === "archived") continue;
      if ((path === w.path || path.startsWith(w.path + "/")) && (best === null || w.path.length > best.path.length)) {
        best = w;
      }
    }
    return best;
  }

  pendingCleanups(): number {
    let n = 0;
    for (const w of this.workspaces.values()) if (w.last_cleanup?.status === "pending") n++;
    return n;
  }
}

function asArray<T>(value: unknown): T[] {
  return Array.isArray(value) ? (value as T[]) : [];
}
