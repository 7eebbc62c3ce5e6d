"""The workspace service: create, archive, unarchive, remove, rename, keep (the facade).

The rest of the daemon uses this class (handed in by the composition root: auto-archive, recovery,
turns, project.remove); each operation lives in its own module, over one shared `Context`.

Every structural operation runs under `coord.exclusive(...)` (admission closed, holders drained,
row resolved under the reservation) and follows the durable order (docs/ARCHITECTURE.md):
intent committed -> fault point -> effect on disk -> fault point -> completion committed.
Each effect is idempotent or detectable on replay (the row's state and incarnation, the on-disk
marker, the rename journal), which is what the startup recovery pass relies on.
"""

from __future__ import annotations

from typing import Any

from xum_protocol.models.workspace import (
    WorkspaceArchiveResult,
    WorkspaceCreateParams,
    WorkspaceCreateResult,
    WorkspaceInfo,
    WorkspaceListParams,
    WorkspaceRemoveResult,
    WorkspaceRenameResult,
    WorkspaceResult,
    WorkspaceSetupResult,
    WorkspaceUnarchiveResult,
)

from xumd.lifecycle import listing, rows
from xumd.lifecycle.archive import archive as do_archive
from xumd.lifecycle.context import Context
from xumd.lifecycle.create import IntentBinding
from xumd.lifecycle.create import create as do_create
from xumd.lifecycle.keep_interrupted import keep as do_keep
from xumd.lifecycle.remove import remove as do_remove
from xumd.lifecycle.rename import rename as do_rename
from xumd.lifecycle.rerun_setup import rerun as do_rerun_setup
from xumd.lifecycle.unarchive import unarchive as do_unarchive

__all__ = ["IntentBinding", "WorkspaceService"]


class WorkspaceService(Context):
    """The shared context (lookups, `info`, `publish`, `cleanup`: recovery and turns use them
    too) plus one method per operation."""

    # -- reads ----------------------------------------------------------------------------------

    def get(self, workspace_id: str) -> WorkspaceResult:
        return WorkspaceResult(workspace=self.info(self.row(workspace_id)))

    def list_workspaces(self, project_id: str | None, state: str | None) -> list[WorkspaceInfo]:
        if project_id is not None:
            self.project(project_id)
        return [self.info(r) for r in rows.list_workspaces(self.store, project_id, state)]

    def list_json(self, params: WorkspaceListParams) -> dict[str, Any]:
        """`workspace.list`'s answer as its JSON value, built from the rows directly
        (lifecycle/listing.py); the same bytes as `list_workspaces` through the models."""
        if params.project_id is not None:
            self.project(params.project_id)
        return listing.listing(
            self.store,
            self._info_json,
            project_id=params.project_id,
            state=params.state,
            limit=params.limit,
            after=params.after,
        )

    def _info_json(self, workspace_id: str) -> dict[str, Any]:
        """The model path for a row the listing does not build itself (read in the same
        synchronous step as the listing: it is there)."""
        row = rows.get_workspace(self.store, workspace_id)
        if row is None:
            raise RuntimeError(f"workspace {workspace_id!r} vanished during a listing")
        return self.info(row).model_dump(mode="json")

    # -- operations -------------------------------------------------------------------------------

    async def create(
        self, params: WorkspaceCreateParams, binding: IntentBinding | None = None
    ) -> WorkspaceCreateResult:
        return await do_create(self, params, binding)

    async def archive(self, workspace_id: str, stop: bool = False) -> WorkspaceArchiveResult:
        return await do_archive(self, workspace_id, stop)

    async def unarchive(self, workspace_id: str) -> WorkspaceUnarchiveResult:
        return await do_unarchive(self, workspace_id)

    async def remove(
        self, workspace_id: str, force: bool = False, *, expect_state: str | None = None
    ) -> WorkspaceRemoveResult:
        return await do_remove(self, workspace_id, force, expect_state=expect_state)

    async def rename(self, workspace_id: str, name: str) -> WorkspaceRenameResult:
        return await do_rename(self, workspace_id, name)

    async def keep(self, workspace_id: str) -> WorkspaceResult:
        return await do_keep(self, workspace_id)

    async def rerun_setup(self, workspace_id: str) -> WorkspaceSetupResult:
        return await do_rerun_setup(self, workspace_id)
