// The extension's commands, on the client and a small UI interface (quick picks, input boxes,
// messages, windows, terminals). extension.ts implements `Ui` with the `vscode` API; the tests
// implement it with scripted answers and run these commands against a real daemon.

import {
  isRpcError,
  iterWorkspaces,
  type ErrorKind,
  type ProjectInfo,
  type ScriptResult,
  type WorkspaceArchiveResult,
  type WorkspaceInfo,
  type WorkspaceRemoveResult,
  type WorkspaceUnarchiveResult,
  type XumClient,
  type XumRpcError,
} from "../../../ts/src/index.js";
import { describeCleanup, formatError } from "./format.js";
import { remoteAuthority, terminalCommand } from "./remote.js";

export interface PickItem<T> {
  label: string;
  description?: string;
  value: T;
}

export interface Ui {
  pick<T>(items: PickItem<T>[], placeholder: string): Promise<T | undefined>;
  input(prompt: string, validate: (value: string) => string | null): Promise<string | undefined>;
  /** Ask before something destructive; true when the user chose `action`. */
  confirm(message: string, action: string): Promise<boolean>;
  info(message: string): void;
  error(message: string): void;
  /** `authority`: the remote authority of the host the folder is on (none: this machine). */
  openFolder(path: string, newWindow: boolean, authority?: string): Promise<void>;
  openTerminal(name: string, place: TerminalPlace): void;
}

/** Where a terminal runs: a directory of this machine, or a command (ssh into a host's checkout). */
export type TerminalPlace = { cwd: string } | { argv: string[] };

/** The name rule (`xum_protocol.names`), checked before asking the daemon. */
export function validateName(name: string): string | null {
  if (name.length === 0 || name.length > 64) return "1 to 64 characters";
  if (!/^[A-Za-z0-9._-]+$/.test(name)) return "letters, digits, '.', '_' and '-' only";
  if (name.startsWith(".") || name.startsWith("-")) return "must not start with '.' or '-'";
  if (name.includes("..")) return "must not contain '..'";
  return null;
}

type WorkspaceRef = Pick<WorkspaceInfo, "id" | "name">;

export class Commands {
  constructor(
    private readonly client: XumClient,
    private readonly ui: Ui,
  ) {}

  /** Every project and workspace, read now (the Refresh command); a failure is shown. */
  async listAll(): Promise<{ projects: ProjectInfo[]; workspaces: WorkspaceInfo[] } | undefined> {
    return this.guard(async () => {
      const { projects } = await this.client.call("project.list");
      // Page by page: one answer for a root of tens of thousands would pass the frame cap.
      const workspaces: WorkspaceInfo[] = [];
      for await (const w of iterWorkspaces(this.client)) workspaces.push(w);
      return { projects, workspaces };
    });
  }

  /** New workspace: pick the project (unless given), name it, create it. */
  async newWorkspace(projectId?: string): Promise<WorkspaceInfo | undefined> {
    return this.guard(async () => {
      let project = projectId;
      if (project === undefined) {
        const { projects } = await this.client.call("project.list");
        if (projects.length === 0) {
          this.ui.error("xum: no projects: add one with `xum project add PATH`");
          return undefined;
        }
        project = await this.ui.pick(
          projects.map((p) => ({ label: p.name, description: p.path, value: p.id })),
          "Project for the new workspace",
        );
        if (project === undefined) return undefined;
      }
      const name = await this.ui.input("Name of the new workspace", validateName);
      if (name === undefined) return undefined;
      const { workspace, setup } = await this.client.call("workspace.create", { project_id: project, name });
      this.reportSetup("created", workspace, setup);
      return workspace;
    });
  }

  /**
   * Archive. When the daemon says `busy`, the holders are shown and the user may stop the
   * daemon's own processes and archive (`stop: true`); other holders still refuse.
   */
  async archive(ws: WorkspaceRef): Promise<WorkspaceArchiveResult | undefined> {
    return this.overridable(
      "busy",
      (stop) => this.client.call("workspace.archive", { workspace_id: ws.id, stop }),
      (result) => this.reportArchive(result),
      () => `Stop the processes xum runs in '${ws.name}' and archive it?`,
      "Stop and archive",
    );
  }

  async unarchive(ws: WorkspaceRef): Promise<WorkspaceUnarchiveResult | undefined> {
    return this.guard(async () => {
      const result = await this.client.call("workspace.unarchive", { workspace_id: ws.id });
      this.reportSetup("restored", result.workspace, result.setup);
      const kept = result.restored.kept_at;
      if (kept) {
        // Preserved files that could not be put back: the user's copy is kept, and said where
        // (as the command line says it, and exits 1).
        const files = (result.restored.unverified ?? []).join(", ");
        this.ui.error(`xum: '${result.workspace.name}' restored, but not in place: ${files}; your saved copy is kept at ${kept}`);
      }
      return result;
    });
  }

  /** Remove after a confirmation; `not_safe` may be overridden with a second, explicit one. */
  async remove(ws: WorkspaceRef): Promise<WorkspaceRemoveResult | undefined> {
    const sure = await this.ui.confirm(
      `Remove workspace '${ws.name}'? Its checkout is deleted (uncommitted work is saved as a snapshot ref; the branch is kept).`,
      "Remove",
    );
    if (!sure) return undefined;
    return this.overridable(
      "not_safe",
      (force) => this.client.call("workspace.remove", { workspace_id: ws.id, force }),
      (result) => this.reportRemove(ws, result),
      (err) => `Remove '${ws.name}' anyway? ${err.message}`,
      "Remove anyway",
    );
  }

  /**
   * `call(false)`; refused with `kind`, the error is shown and, when the user confirms
   * `question`, `call(true)` (the override: stop, force). Each result goes to `report`.
   */
  private async overridable<R>(
    kind: ErrorKind,
    call: (override: boolean) => Promise<R>,
    report: (result: R) => void,
    question: (err: XumRpcError) => string,
    action: string,
  ): Promise<R | undefined> {
    try {
      const result = await call(false);
      report(result);
      return result;
    } catch (err) {
      this.ui.error(formatError(err));
      if (!isRpcError(err, kind)) return undefined;
      if (!(await this.ui.confirm(question(err), action))) return undefined;
      return this.guard(async () => {
        const result = await call(true);
        report(result);
        return result;
      });
    }
  }

  /**
   * Open the checkout in a new window (only an active workspace has one); on a host, through
   * Remote-SSH.
   */
  async openInNewWindow(ws: WorkspaceRef): Promise<boolean> {
    const current = await this.activeWorkspace(ws);
    if (current === undefined) return false;
    const host = this.client.host;
    if (host === null) await this.ui.openFolder(current.path, true);
    else await this.ui.openFolder(current.path, true, remoteAuthority(host));
    return true;
  }

  /** A terminal whose working directory is the checkout; on a host, a login shell there over ssh. */
  async openTerminal(ws: WorkspaceRef): Promise<boolean> {
    const current = await this.activeWorkspace(ws);
    if (current === undefined) return false;
    const host = this.client.host;
    const name = `xum: ${current.name}`;
    if (host === null) this.ui.openTerminal(name, { cwd: current.path });
    else this.ui.openTerminal(`${name} (${host.name})`, { argv: terminalCommand(host, current.path) });
    return true;
  }

  private async activeWorkspace(ws: WorkspaceRef): Promise<WorkspaceInfo | undefined> {
    return this.guard(async () => {
      // Ask the daemon now: the tree may be a moment behind (renamed, archived meanwhile).
      const { workspace } = await this.client.call("workspace.get", { workspace_id: ws.id });
      if (workspace.state !== "active") {
        this.ui.error(`xum: '${workspace.name}' is ${workspace.state}: it has no checkout to open${workspace.state === "archived" ? " (unarchive it first)" : ""}`);
        return undefined;
      }
      return workspace;
    });
  }

  /** How a create or an unarchive went, its setup included: a failed setup is an error. */
  private reportSetup(done: string, workspace: WorkspaceInfo, setup: ScriptResult): void {
    if (setup.status === "failed" || setup.status === "timeout") {
      this.ui.error(`xum: workspace '${workspace.name}' ${done}, but its setup ${setup.status}: ${setup.error ?? ""}`);
    } else if (setup.status === "untrusted") {
      this.ui.info(`xum: workspace '${workspace.name}' ${done}; setup skipped: ${setup.hint ?? "the project's config is not trusted"}`);
    } else {
      this.ui.info(`xum: workspace '${workspace.name}' ${done} at ${workspace.path}`);
    }
  }

  private reportArchive(result: WorkspaceArchiveResult): void {
    const cleanup = describeCleanup(result.cleanup);
    const stopped = result.stopped && result.stopped.length > 0 ? `; stopped ${result.stopped.join(", ")}` : "";
    const text = `xum: '${result.workspace.name}' archived${stopped}${cleanup ? `; ${cleanup}` : ""}`;
    if (result.cleanup.status === "failed") this.ui.error(text);
    else this.ui.info(text);
  }

  private reportRemove(ws: WorkspaceRef, result: WorkspaceRemoveResult): void {
    const cleanup = describeCleanup(result.cleanup);
    const text = `xum: '${ws.name}' ${result.removed ? "removed" : "not removed"}${cleanup ? `; ${cleanup}` : ""}`;
    if (!result.removed || result.cleanup.status === "failed") this.ui.error(text);
    else this.ui.info(text);
  }

  private async guard<T>(fn: () => Promise<T | undefined>): Promise<T | undefined> {
    try {
      return await fn();
    } catch (err) {
      this.ui.error(formatError(err));
      return undefined;
    }
  }
}
