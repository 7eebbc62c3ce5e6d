"""Install the cleanup feature: the service, `cleanup.list` / `cleanup.retry`, the status provider
(`daemon.status` details['cleanup']), the background retry service and its shutdown drain."""

from __future__ import annotations

from xum_protocol.errors import ErrorKind
from xum_protocol.models.cleanup import (
    CLEANUP_LIST,
    CLEANUP_RETRY,
    CleanupListParams,
    CleanupListResult,
    CleanupRetryParams,
    CleanupRetryResult,
    CleanupStatus,
    Obligation,
)

from xumd.app import App
from xumd.base.errors import XumError
from xumd.checkouts.exclusion import DirectoryExclusion
from xumd.cleanup import status as status_mod
from xumd.cleanup.fence import WorkspaceRecords
from xumd.cleanup.obligations import PENDING
from xumd.cleanup.outcomes import RememberCleanup
from xumd.cleanup.planning import TeardownEnv
from xumd.cleanup.retry import RetryService
from xumd.cleanup.service import PATH_LANE, RECLAIM_LANE, CleanupService
from xumd.cleanup.steps import UnsavedWork
from xumd.cleanup.teardown_scripts import ProjectTeardown, TeardownScripts
from xumd.rpc.dispatch import RequestContext
from xumd.store.memo import StoreMemo
from xumd.system.git import Git

STATUS_KEY = "cleanup"


def install(
    app: App,
    *,
    git: Git,
    directories: DirectoryExclusion,
    scripts: TeardownScripts,
    unsaved: UnsavedWork,
    teardown_env: TeardownEnv,
    remember_cleanup: RememberCleanup,
    records: WorkspaceRecords,
) -> CleanupService:
    """Its collaborators come from the composition root: git, the directory exclusion shared
    with the lifecycle, the script runner that runs teardowns, the lifecycle's comparison of a
    lingering checkout with its archive (asked before the checkout is trashed), the
    workspace's variables a teardown obligation keeps, and the writer of a workspace's
    `last_cleanup` and the workspace rows cleanup reads (the fence, the planner, the test of a
    workspace id), all the lifecycle's."""
    service = app.provide(
        CleanupService(
            app,
            git=git,
            directories=directories,
            teardown=ProjectTeardown(scripts),
            unsaved=unsaved,
            teardown_env=teardown_env,
            remember_cleanup=remember_cleanup,
            records=records,
        )
    )
    retry = app.provide(RetryService(service))

    async def list_(params: CleanupListParams, ctx: RequestContext) -> CleanupListResult:
        service.flush_announcements()
        if params.workspace_id is not None:
            _require_workspace(service, params.workspace_id)
        found = service.obligations.list(
            workspace_id=params.workspace_id, state=params.state, limit=params.limit
        )
        return CleanupListResult(
            obligations=[ob.model() for ob in found],
            pending=service.obligations.count(PENDING),
        )

    async def retry_(params: CleanupRetryParams, ctx: RequestContext) -> CleanupRetryResult:
        if params.obligation_id is None and params.workspace_id is None:
            result = await service.run_cycle(PATH_LANE)
            retry.poke(RECLAIM_LANE)
            touched = result.attempted
        else:
            workspace_id = service.require_known(
                obligation_id=params.obligation_id, workspace_id=params.workspace_id
            )
            await service.run_workspace(workspace_id, force=True, include_reclaim=True)
            touched = [workspace_id]
        statuses: dict[str, CleanupStatus] = {}
        attempted: list[Obligation] = []
        for workspace_id in touched:
            status = service.status(workspace_id)
            if status is not None:
                statuses[workspace_id] = status
            attempted.extend(ob.model() for ob in service.obligations.for_workspace(workspace_id))
        if params.obligation_id is not None:
            attempted = [ob for ob in attempted if ob.id == params.obligation_id] + [
                ob for ob in attempted if ob.id != params.obligation_id
            ]
        return CleanupRetryResult(attempted=attempted, workspaces=statuses)

    app.router.add(CLEANUP_LIST, list_)
    app.router.add(CLEANUP_RETRY, retry_)
    # Polled by monitors: recomputed only when a row changed (or after a second).
    app.status_providers[STATUS_KEY] = StoreMemo(
        app.store, lambda: status_mod.summary_details(service.obligations)
    )
    app.after_ready("cleanup-retry", retry.run)
    app.on_shutdown("cleanup-retry", retry.stop)
    return service


def _require_workspace(service: CleanupService, workspace_id: str) -> None:
    """A workspace id the daemon knows (a row, a tombstone or obligations); an unknown one is
    `not_found`, never an empty list that reads as "nothing pending"."""
    if not workspace_id.startswith("ws_"):
        raise XumError(
            ErrorKind.INVALID_SCOPE,
            f"{workspace_id!r} is not a workspace id (a workspace id starts with 'ws_')",
            id=workspace_id,
        )
    if not service.records.is_known(workspace_id) and not service.obligations.for_workspace(
        workspace_id
    ):
        raise XumError(
            ErrorKind.NOT_FOUND, f"workspace {workspace_id!r} not found", id=workspace_id
        )
