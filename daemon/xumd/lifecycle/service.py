"""The workspace service: create, archive, unarchive, remove, rename, keep (the facade).

The lifecycle's handlers use this class; the features above it get it through the narrow port
each defines (auto-archive and gc archive or remove through it, turns create through it, usage
looks a row up), handed in by the composition root. Each operation lives in its own module, over
one `Context` the service builds from its collaborators and keeps to itself.

Every structural operation runs under `coord.exclusive(...)` (admission closed, holders drained,
row resolved under the reservation) and follows the durable order (docs/ARCHITECTURE.md):
intent committed -> fault point -> effect on disk -> fault point -> completion committed.
Each effect is idempotent or detectable on replay (the row's state and incarnation, the on-disk
marker, the rename journal), which is what the startup recovery pass relies on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
from xum_protocol.models.workspace import (
    WorkspaceArchiveResult,
    WorkspaceCreateParams,
    WorkspaceCreateResult,
    WorkspaceInfo,
    WorkspaceListParams,
    WorkspaceReallocatePortsResult,
    WorkspaceRemoveResult,
    WorkspaceRenameResult,
    WorkspaceResult,
    WorkspaceSetupResult,
    WorkspaceUnarchiveResult,
)

from xumd.cleanup.service import CleanupService
from xumd.lifecycle import listing, ports, rows
from xumd.lifecycle.archive import archive as do_archive
from xumd.lifecycle.capacity import MakeRoom
from xumd.lifecycle.context import Context, FailureGuard
from xumd.lifecycle.coordinator import Coordinator
from xumd.lifecycle.create import IntentBinding
from xumd.lifecycle.create import create as do_create
from xumd.lifecycle.hooks import LifecycleHooks
from xumd.lifecycle.keep_interrupted import keep as do_keep
from xumd.lifecycle.pool.service import PoolService, Surplus
from xumd.lifecycle.reallocate_ports import reallocate_ports as do_reallocate_ports
from xumd.lifecycle.remove import remove as do_remove
from xumd.lifecycle.rename import rename as do_rename
from xumd.lifecycle.rerun_setup import rerun as do_rerun_setup
from xumd.lifecycle.rows import ProjectRow, WorkspaceRow
from xumd.lifecycle.scripts import ScriptRunner
from xumd.lifecycle.snapshot import Snapshotter
from xumd.lifecycle.unarchive import unarchive as do_unarchive
from xumd.system.git import Git

if TYPE_CHECKING:
    from xumd.app import App

__all__ = ["IntentBinding", "WorkspaceService"]


class WorkspaceService:
    """One method per operation, and the reads the features above ask for (`row`, `info`)."""

    def __init__(
        self,
        app: App,
        coord: Coordinator,
        git: Git,
        scripts: ScriptRunner,
        snapshots: Snapshotter,
        *,
        cleanup: CleanupService,
        hooks: LifecycleHooks,
        failures: FailureGuard,
        pool: PoolService,
        room: MakeRoom,
    ) -> None:
        self.store = app.store
        self.snapshots = snapshots
        self.pool = pool
        """The warm pool (usage counts its entries, gc collects them)."""
        self.context = Context(
            app,
            coord,
            git,
            scripts,
            snapshots,
            cleanup,
            hooks=hooks,
            failures=failures,
            pool=pool,
            room=room,
        )
        """What the operation modules share (and project.remove, which checks and removes
        each workspace through them)."""

    # -- reads ----------------------------------------------------------------------------------

    def row(self, workspace_id: str) -> WorkspaceRow:
        return self.context.row(workspace_id)

    def project(self, project_id: str) -> ProjectRow:
        return self.context.project(project_id)

    def info(self, row: WorkspaceRow) -> WorkspaceInfo:
        return self.context.info(row)

    def get(self, workspace_id: str) -> WorkspaceResult:
        return WorkspaceResult(workspace=self.info(self.row(workspace_id)))

    async def show(self, workspace_id: str) -> WorkspaceResult:
        """`get`, and its ports a process outside the workspace listens on now (probed off the
        event loop; a workspace without ports costs nothing more)."""
        row = self.row(workspace_id)
        held = ports.held(self.store, row.id)
        taken = await anyio.to_thread.run_sync(ports.taken, held, row.id) if held else []
        return WorkspaceResult(workspace=self.info(row), ports_taken=taken)

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
        return await do_create(self.context, params, binding)

    async def archive(self, workspace_id: str, stop: bool = False) -> WorkspaceArchiveResult:
        return await do_archive(self.context, workspace_id, stop)

    async def unarchive(self, workspace_id: str) -> WorkspaceUnarchiveResult:
        return await do_unarchive(self.context, workspace_id)

    async def remove(
        self, workspace_id: str, force: bool = False, *, expect_state: str | None = None
    ) -> WorkspaceRemoveResult:
        return await do_remove(self.context, workspace_id, force, expect_state=expect_state)

    async def rename(self, workspace_id: str, name: str) -> WorkspaceRenameResult:
        return await do_rename(self.context, workspace_id, name)

    async def reallocate_ports(
        self, workspace_id: str, which: list[int] | None
    ) -> WorkspaceReallocatePortsResult:
        return await do_reallocate_ports(self.context, workspace_id, which)

    async def keep(self, workspace_id: str) -> WorkspaceResult:
        return await do_keep(self.context, workspace_id)

    async def rerun_setup(self, workspace_id: str) -> WorkspaceSetupResult:
        return await do_rerun_setup(self.context, workspace_id)

    # -- the warm pool (gc) ---------------------------------------------------------------------

    def pool_surplus(self) -> list[Surplus]:
        return self.pool.surplus()

    async def drop_pool_entry(self, entry_id: str) -> bool:
        return await self.pool.drop_entry(entry_id)

    def pool_held_back(self) -> dict[str, str]:
        return self.pool.held_back()
