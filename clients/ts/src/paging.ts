// `workspace.list` page by page (protocol 1.2): every workspace, a bounded answer at a time.
// Each page asks for `page` workspaces after the previous answer's `next` cursor; the listing
// ends when `next` is null. The daemon pages by keyset on the listing order (creation order, a
// number that only grows), so a workspace created or removed between pages neither repeats nor
// hides another.

import type { WorkspaceInfo, WorkspaceListParams } from "./generated/protocol.js";
import type { XumClient } from "./client.js";

export const DEFAULT_PAGE = 500;

/** Every workspace matching `filters` (`project_id`, `state`), `page` per call. */
export async function* iterWorkspaces(
  client: Pick<XumClient, "call">,
  filters: Omit<WorkspaceListParams, "limit" | "after"> = {},
  page: number = DEFAULT_PAGE,
): AsyncGenerator<WorkspaceInfo, void, undefined> {
  let after: string | null = null;
  for (;;) {
    const params: WorkspaceListParams = { ...filters, limit: page };
    if (after !== null) params.after = after;
    const result = await client.call("workspace.list", params);
    yield* result.workspaces;
    const next: unknown = result.next ?? null;
    // Taken as the end, a `next` that is no cursor would make a listing cut short look complete.
    if (next !== null && typeof next !== "string") {
      throw new Error(`workspace.list answered a \`next\` that is no cursor: ${JSON.stringify(next)}`);
    }
    // A cursor that does not advance would loop for ever: never expected of a daemon.
    if (next !== null && next === after) throw new Error("workspace.list answered the same cursor twice");
    if (next === null) return;
    after = next;
  }
}
