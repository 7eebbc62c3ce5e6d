// Keeps a WorkspaceModel current from a client: the subscription's snapshots and events, and the
// workspaces whose cleanup moved. The daemon announces a cleanup step's progress as
// `cleanup.obligation_changed` (not as a workspace event), and a workspace's `last_cleanup` is
// derived from its obligations: so on such an event the workspace is read again.

import { isEvent, isRpcError, type SnapshotInfo, type XumClient } from "../../../ts/src/index.js";
import type { WorkspaceModel } from "./model.js";

export const SUBSCRIBED_TYPES = ["project.", "workspace.", "cleanup."];

export class ModelSync {
  private readonly refetching = new Set<string>();
  private readonly again = new Set<string>();

  constructor(
    private readonly client: XumClient,
    private readonly model: WorkspaceModel,
    private readonly changed: () => void,
  ) {
    client.on("snapshot", (info) => {
      model.reset(info.snapshot);
      changed();
    });
    client.on("event", (event) => {
      if (isEvent(event, "cleanup.obligation_changed")) {
        const id = event.data.obligation.workspace_id;
        if (model.workspaces.has(id)) void this.refetch(id);
        return;
      }
      if (model.apply(event)) changed();
    });
  }

  subscribe(): Promise<SnapshotInfo> {
    return this.client.subscribe({ types: SUBSCRIBED_TYPES });
  }

  /** Read one workspace again; one read at a time per workspace, and one more if asked meanwhile. */
  private async refetch(id: string): Promise<void> {
    if (this.refetching.has(id)) {
      this.again.add(id);
      return;
    }
    this.refetching.add(id);
    try {
      do {
        this.again.delete(id);
        try {
          const { workspace } = await this.client.call("workspace.get", { workspace_id: id });
          // A removal may have been applied while the read was under way: do not bring it back.
          if (this.model.workspaces.has(id)) {
            this.model.workspaces.set(id, workspace);
            this.changed();
          }
        } catch (err) {
          if (isRpcError(err, "not_found")) {
            if (this.model.workspaces.delete(id)) this.changed();
          }
          // Anything else (a lost connection): the resubscription's replay or snapshot follows.
        }
      } while (this.again.has(id));
    } finally {
      this.refetching.delete(id);
    }
  }
}
