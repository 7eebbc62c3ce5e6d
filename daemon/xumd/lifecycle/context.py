"""What every workspace operation shares: its collaborators, lookups under the caller's
reservation, the compare-and-swap update, events, quiescence and the cleanup hand-off.

The operations themselves live in one module each (create, archive, unarchive, remove, rename,
keep); `xumd.lifecycle.service.WorkspaceService` is the facade the rest of the daemon uses.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.cleanup import CleanupStatus
from xum_protocol.models.workspace import WorkspaceInfo

from xumd.base import logs
from xumd.base.errors import XumError
from xumd.base.events import EventBus
from xumd.base.requestcut import cut_reason
from xumd.checkouts import marker
from xumd.cleanup.service import CleanupService
from xumd.lifecycle import ids, ports, rows, views, wsenv
from xumd.lifecycle.capacity import MakeRoom
from xumd.lifecycle.coordinator import Coordinator
from xumd.lifecycle.hooks import LifecycleHooks, RowSettler, busy_message
from xumd.lifecycle.pool.service import PoolService
from xumd.lifecycle.rows import ProjectRow, WorkspaceRow
from xumd.lifecycle.scripts import ScriptRunner
from xumd.lifecycle.snapshot import Snapshotter
from xumd.store import Store
from xumd.system.git import Git

if TYPE_CHECKING:
    from xumd.app import App

log = logs.get("xumd.lifecycle.context")

UNDO_DEADLINE_S = 60.0
"""How long an undo (after a failure or a cancellation) may take, shielded."""


def require_project(store: Any, project_id: str) -> ProjectRow:
    ids.check_id(project_id, ids.PROJECT, "project")
    project = rows.get_project(store, project_id)
    if project is None:
        raise XumError(ErrorKind.NOT_FOUND, f"project {project_id!r} not found", id=project_id)
    return project


def require_workspace(store: Any, workspace_id: str) -> WorkspaceRow:
    ids.check_id(workspace_id, ids.WORKSPACE, "workspace")
    row = rows.get_workspace(store, workspace_id)
    if row is None:
        raise XumError(
            ErrorKind.NOT_FOUND, f"workspace {workspace_id!r} not found", id=workspace_id
        )
    return row


def some(paths: list[str], most: int = 20) -> str:
    """A bounded list of paths for an error message."""
    more = f" and {len(paths) - most} more" if len(paths) > most else ""
    return ", ".join(paths[:most]) + more


def invalid_state(row: WorkspaceRow, message: str, **data: Any) -> XumError:
    return XumError(ErrorKind.INVALID_STATE, message, state=row.state, **data)


def is_rows_checkout(row: WorkspaceRow) -> bool:
    """The path exists and carries this row's marker (and identity, when recorded)."""
    if not row.path.is_dir():
        return False
    found = marker.read_marker(row.path)
    if found is None or (found.workspace_id, found.incarnation) != (row.id, row.incarnation):
        return False
    if row.ino is not None:
        st = row.path.stat()
        return (st.st_dev, st.st_ino) == (row.dev, row.ino)
    return True


_MID_WAY = ("archiving", "restoring", "removing")


def _mid_way(store: Store, row: WorkspaceRow) -> bool:
    if row.state in _MID_WAY or (row.state == "creating" and not row.interrupted):
        return True
    return rows.has_rename_journal(store, row.id) and not row.interrupted


def _describe(op: str, exc: BaseException) -> str:
    if isinstance(exc, XumError):
        return f"{op} failed ({exc.kind.value}: {exc.message})"
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        return f"{op} was cancelled"
    return f"{op} failed ({type(exc).__name__}: {exc})"


class FailureGuard:
    """What a structural operation that raised leaves: its row settled before its exclusive
    reservation opens. It reads only the store and recovery's row settler, both built before
    it, so the composition root builds it before the coordinator that calls it, and the
    coordinator takes it at construction."""

    def __init__(self, store: Store, settle_row: RowSettler) -> None:
        self.store = store
        self.settle_row = settle_row

    def __call__(self, workspace_id: str, op: str) -> Callable[[BaseException], None]:
        """Taken when `op` enters the workspace's exclusive reservation: if it raises, its row
        is settled (`settle_failed`). A row that is already mid-way at entry is not this
        operation's: only a create (which holds no exclusive reservation) leaves a row mid-way
        while another operation can enter, and a refusal of that operation must not touch the
        create's row."""
        row = rows.get_workspace(self.store, workspace_id)
        foreign = row is not None and _mid_way(self.store, row)

        def settle(exc: BaseException) -> None:
            if not foreign:
                self.settle_failed(workspace_id, op, exc)

        return settle

    def settle_failed(self, workspace_id: str, op: str, exc: BaseException) -> None:
        """After `op` raised (any exception: a refusal, a bug, a cancellation), leave no row
        mid-way: a row still in a transitional state (`creating` unflagged, `archiving`,
        `restoring`, `removing`) or with a rename journal and no flag is settled by recovery's
        own logic, exactly as a crash at that point would leave it after a restart. A row that
        the operation already settled (rolled back, undone, committed) is left alone. Never
        raises: it runs on the way out of a failure."""
        try:
            row = rows.get_workspace(self.store, workspace_id)
            if row is None or not _mid_way(self.store, row):
                return
            cause = _describe(op, exc)
            action = self.settle_row(row.id, cause)
            log.warning(
                "workspace.failure_settled", workspace=row.id, op=op, action=action, cause=cause
            )
        except Exception:
            log.exception("workspace.failure_settle_failed", workspace=workspace_id, op=op)


class Announcer:
    """A workspace as the protocol shows it (`info`: its row, cleanup status, ports and
    environment) and its events. It reads the store and the cleanup's status only, so the
    composition root builds one for recovery before the workspace service exists."""

    def __init__(self, store: Store, events: EventBus, cleanup: CleanupService) -> None:
        self.store = store
        self.events = events
        self.cleanup = cleanup

    def info(self, row: WorkspaceRow) -> WorkspaceInfo:
        info = views.workspace_info(row, self.cleanup.status)
        # Ports and environment live in their own tables (lifecycle/ports.py, wsenv.py).
        return info.model_copy(
            update={
                "ports": ports.ports_of(self.store, row.id),
                "named_ports": ports.named_ports(self.store, row.id),
                "env": wsenv.env_of(self.store, row.id),
            }
        )

    def publish(self, event: str, row: WorkspaceRow, **extra: Any) -> None:
        self.events.publish(event, workspace=self.info(row).model_dump(mode="json"), **extra)


class Context:
    """What the operation modules share. Built by the workspace service from its own
    collaborators; the features above the lifecycle never see it (each gets the narrow port it
    uses)."""

    def __init__(  # noqa: PLR0917 - the operations' collaborators, each required
        self,
        app: App,
        coord: Coordinator,
        git: Git,
        scripts: ScriptRunner,
        snapshots: Snapshotter,
        cleanup: CleanupService,
        hooks: LifecycleHooks,
        failures: FailureGuard,
        pool: PoolService,
        room: MakeRoom,
    ) -> None:
        self.app = app
        self.store = app.store
        self.coord = coord
        self.git = git
        self.scripts = scripts
        self.snapshots = snapshots
        self.cleanup = cleanup
        self.hooks = hooks
        self.failures = failures
        self.pool = pool
        self.room = room
        self.announcer = Announcer(app.store, app.events, cleanup)

    # -- rows and views ----------------------------------------------------------------------------

    def info(self, row: WorkspaceRow) -> WorkspaceInfo:
        return self.announcer.info(row)

    def publish(self, event: str, row: WorkspaceRow, **extra: Any) -> None:
        self.announcer.publish(event, row, **extra)

    def project(self, project_id: str) -> ProjectRow:
        return require_project(self.store, project_id)

    def row(self, workspace_id: str) -> WorkspaceRow:
        return require_workspace(self.store, workspace_id)

    def path_for(self, project: ProjectRow, name: str) -> Path:
        return views.workspaces_dir(self.app.paths.workspaces, project) / name

    def update(self, row: WorkspaceRow, **fields: Any) -> WorkspaceRow:
        """CAS on the incarnation the caller resolved; a mismatch is a lost race, not success."""
        new = rows.update_workspace(
            self.store, row.id, expect_incarnation=row.incarnation, **fields
        )
        if new is None:
            raise XumError(
                ErrorKind.NOT_FOUND,
                f"workspace {row.id!r} changed or vanished during the operation",
                id=row.id,
            )
        return new

    def roll_back(self, row: WorkspaceRow, **fields: Any) -> None:
        """Put a row back after a failed step (CAS; a row that changed meanwhile is left)."""
        with self.store.transaction():
            back = rows.update_workspace(
                self.store, row.id, expect_incarnation=row.incarnation, **fields
            )
        if back is not None:
            self.publish("workspace.state_changed", back)

    def settle_failed(self, workspace_id: str, op: str, exc: BaseException) -> None:
        """See `FailureGuard.settle_failed` (create calls it after its own undo)."""
        self.failures.settle_failed(workspace_id, op, exc)

    # -- checks ------------------------------------------------------------------------------------

    def owns_checkout(self, row: WorkspaceRow) -> bool:
        """The path exists and carries this row's marker (and identity, when recorded)."""
        return is_rows_checkout(row)

    async def quiescent(self, row: WorkspaceRow, op: str) -> None:
        holders = await self.hooks.holders(row.ref())
        if holders:
            message = f"cannot {op} {row.name!r}: " + busy_message(holders)
            if op == "archive" and any(h.process_id for h in holders):
                # The daemon's own processes: archive can stop them itself.
                message += "; or archive with stop (`xum ws archive --stop`) to stop the daemon's"
                message += " processes first"
            raise XumError(
                ErrorKind.BUSY,
                message,
                holders=[h.as_dict() for h in holders],
            )

    @asynccontextmanager
    async def directories(self, *paths: Path, label: str = "") -> AsyncIterator[None]:
        """Directory exclusion for several paths, always taken in one order (no deadlock)."""
        async with AsyncExitStack() as stack:
            for path in sorted({os.path.realpath(p) for p in paths}):
                await stack.enter_async_context(self.coord.directories.directory(path, label=label))
            yield

    # -- cleanup hand-off --------------------------------------------------------------------------

    def plan_cleanup(self, project: ProjectRow, row: WorkspaceRow, *, teardown: bool) -> None:
        """Plan the checkout's removal; inside the caller's transaction (see CleanupService)."""
        self.cleanup.plan_checkout_removal(
            workspace_id=row.id,
            project_id=row.project_id,
            incarnation=row.incarnation,
            runtime=row.runtime,
            repo_path=project.path,
            checkout=row.path,
            dev=row.dev,
            ino=row.ino,
            teardown=teardown,
        )

    def cleanup_as_cut(self, workspace_id: str) -> CleanupStatus:
        """The cleanup status to answer for a request cut short after its logical commit (the
        shutdown grace ran out during its physical part): as the store has it, and saying why
        it is still pending."""
        status = self.cleanup.status(workspace_id)
        if status is None:
            return CleanupStatus(status="not_needed", reason="no cleanup obligations")
        if status.status == "pending":
            status.reason = (
                cut_reason(self.app.stopping, "the request")
                + "; the cleanup completes in the background when the daemon next runs"
            )
        return status

    async def run_cleanup(self, workspace_id: str, *, force: bool = False) -> CleanupStatus:
        try:
            return await self.cleanup.run_workspace(workspace_id, force=force)
        except XumError as exc:
            # The logical change is committed; the physical one is reported as it is.
            return CleanupStatus(status="pending", last_error=exc.message)
