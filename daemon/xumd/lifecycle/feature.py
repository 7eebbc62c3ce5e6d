"""Install the lifecycle feature: coordinator, script runner, workspace and project services,
their handlers, and the event snapshot providers."""

from __future__ import annotations

from typing import Any

import orjson
from xum_protocol.models.project import (
    PROJECT_ADD,
    PROJECT_GET,
    PROJECT_LIST,
    PROJECT_REMOVE,
    PROJECT_TRUST,
    ProjectAddParams,
    ProjectIdParams,
    ProjectListParams,
    ProjectListResult,
    ProjectRemoveParams,
    ProjectRemoveResult,
    ProjectResult,
    ProjectTrustParams,
    ProjectTrustResult,
)
from xum_protocol.models.workspace import (
    WORKSPACE_ARCHIVE,
    WORKSPACE_CREATE,
    WORKSPACE_GET,
    WORKSPACE_KEEP,
    WORKSPACE_LIST,
    WORKSPACE_REALLOCATE_PORTS,
    WORKSPACE_REMOVE,
    WORKSPACE_RENAME,
    WORKSPACE_SETUP,
    WORKSPACE_UNARCHIVE,
    WorkspaceArchiveParams,
    WorkspaceArchiveResult,
    WorkspaceCreateParams,
    WorkspaceCreateResult,
    WorkspaceIdParams,
    WorkspaceListParams,
    WorkspaceReallocatePortsParams,
    WorkspaceReallocatePortsResult,
    WorkspaceRemoveParams,
    WorkspaceRemoveResult,
    WorkspaceRenameParams,
    WorkspaceRenameResult,
    WorkspaceResult,
    WorkspaceSetupResult,
    WorkspaceUnarchiveResult,
)

from xumd.app import App
from xumd.base import logs
from xumd.checkouts.exclusion import DirectoryExclusion
from xumd.cleanup.outcomes import RememberCleanup
from xumd.cleanup.planning import TeardownEnv
from xumd.cleanup.service import CleanupService
from xumd.lifecycle import keyedcalls, rows, wsenv
from xumd.lifecycle.capacity import MakeRoom
from xumd.lifecycle.context import Announcer, FailureGuard
from xumd.lifecycle.coordinator import Coordinator
from xumd.lifecycle.hooks import LifecycleHooks, RowSettler
from xumd.lifecycle.pool.service import PoolService
from xumd.lifecycle.projects import ProjectService
from xumd.lifecycle.scripts import ScriptLeases, ScriptRunner
from xumd.lifecycle.service import WorkspaceService
from xumd.lifecycle.snapshot import Snapshotter
from xumd.lifecycle.unarchive import ArchiveComparison
from xumd.rpc.dispatch import Encoded, RequestContext
from xumd.system.containment import Containment
from xumd.system.git import Git


def scripts(app: App, *, leases: ScriptLeases, containment: Containment) -> ScriptRunner:
    """The project script runner (setup and teardown): built by the composition root before the
    cleanup feature, which runs teardowns through it; each run holds a lease of the processes
    feature's store and carries the containment's marker."""
    return ScriptRunner(
        app.store,
        app.paths.root,
        timeout_s=app.config.script_timeout_s,
        grace_s=app.config.stop_grace_s,
        leases=leases,
        containment=containment,
    )


def snapshots(app: App, git: Git) -> Snapshotter:
    """The snapshotter: built by the composition root before the cleanup feature, whose trash
    step compares a lingering checkout with its archive through it (`archive_comparison`)."""
    return Snapshotter(git, app.paths.root / "tmp", app.paths.archive_store)


def archive_comparison(app: App, snapshots: Snapshotter) -> ArchiveComparison:
    """What the cleanup asks before it trashes an archived checkout: whether it holds work its
    archive does not (the comparison unarchive refuses on)."""
    return ArchiveComparison(app.store, snapshots, app.paths.archive_store)


def teardown_env(app: App) -> TeardownEnv:
    """A teardown obligation keeps the workspace's variables: it may run after they are gone."""
    return lambda workspace_id: wsenv.frozen(app.store, workspace_id)


def remember_cleanup(app: App) -> RememberCleanup:
    """Cleanup keeps a workspace's `last_cleanup` current; the row is ours."""
    return lambda workspace_id, status: rows.set_last_cleanup(app.store, workspace_id, status)


def workspace_records(app: App) -> rows.StoreWorkspaceRecords:
    """The workspace rows cleanup reads; they are ours."""
    return rows.StoreWorkspaceRecords(app.store)


def announcer(app: App, cleanup: CleanupService) -> Announcer:
    """A workspace's events as the protocol shows it: recovery's reconciler publishes through
    one, built before the workspace service."""
    return Announcer(app.store, app.events, cleanup)


def failure_guard(app: App, *, settle_row: RowSettler) -> FailureGuard:
    """A structural operation that raises settles its row (recovery's decision, `settle_row`)
    before its reservation opens."""
    return FailureGuard(app.store, settle_row)


def coordinator(
    app: App, *, directories: DirectoryExclusion, failures: FailureGuard
) -> Coordinator:
    """The reservations: built before the workspace service, since the processes feature admits
    through them and the service's hooks ask that feature who holds a checkout."""
    return app.provide(
        Coordinator(
            app.store,
            wait_s=app.config.lock_wait_s,
            directories=directories,
            failure_guard=failures,
        )
    )


def install(
    app: App,
    *,
    coord: Coordinator,
    failures: FailureGuard,
    git: Git,
    scripts: ScriptRunner,
    snapshots: Snapshotter,
    cleanup: CleanupService,
    hooks: LifecycleHooks,
    room: MakeRoom,
) -> WorkspaceService:
    """Its collaborators come from the composition root; returns the workspace service for the
    features above it (each takes the narrow port it uses)."""
    pool = app.provide(
        PoolService(
            app.store,
            git,
            app.paths,
            app.events,
            default_size=app.config.create.pool,
            budget=app.config.gc,
            room=room,
        )
    )
    workspaces = app.provide(
        WorkspaceService(
            app,
            coord,
            git,
            scripts,
            snapshots,
            cleanup=cleanup,
            hooks=hooks,
            failures=failures,
            pool=pool,
            room=room,
        )
    )
    _install_pool(app, pool)
    projects = app.provide(ProjectService(app, coord, git, workspaces.context))

    # -- projects ------------------------------------------------------------------------------

    async def project_add(p: ProjectAddParams, ctx: RequestContext) -> ProjectResult:
        return ProjectResult(project=projects.info(await projects.add(p)))

    async def project_list(p: ProjectListParams, ctx: RequestContext) -> ProjectListResult:
        return ProjectListResult(projects=[projects.info(r) for r in rows.list_projects(app.store)])

    async def project_get(p: ProjectIdParams, ctx: RequestContext) -> ProjectResult:
        return ProjectResult(project=projects.info(projects.get(p.project_id)))

    async def project_remove(p: ProjectRemoveParams, ctx: RequestContext) -> ProjectRemoveResult:
        return await projects.remove(p.project_id, p.force)

    async def project_trust(p: ProjectTrustParams, ctx: RequestContext) -> ProjectTrustResult:
        return projects.trust(p.project_id, p.hash)

    # -- workspaces ----------------------------------------------------------------------------

    async def ws_create(p: WorkspaceCreateParams, ctx: RequestContext) -> WorkspaceCreateResult:
        return await workspaces.create(p)

    async def ws_list(p: WorkspaceListParams, ctx: RequestContext) -> Encoded:
        # Rows straight to the answer's JSON (a `WorkspaceListResult`): no model per row.
        return Encoded(orjson.dumps(workspaces.list_json(p)))

    async def ws_get(p: WorkspaceIdParams, ctx: RequestContext) -> WorkspaceResult:
        return await workspaces.show(p.workspace_id)

    async def ws_reallocate_ports(
        p: WorkspaceReallocatePortsParams, ctx: RequestContext
    ) -> WorkspaceReallocatePortsResult:
        return await workspaces.reallocate_ports(p.workspace_id, p.ports)

    async def ws_rename(p: WorkspaceRenameParams, ctx: RequestContext) -> WorkspaceRenameResult:
        return await workspaces.rename(p.workspace_id, p.name)

    async def ws_archive(p: WorkspaceArchiveParams, ctx: RequestContext) -> WorkspaceArchiveResult:
        return await workspaces.archive(p.workspace_id, stop=p.stop)

    async def ws_unarchive(p: WorkspaceIdParams, ctx: RequestContext) -> WorkspaceUnarchiveResult:
        return await workspaces.unarchive(p.workspace_id)

    async def ws_remove(p: WorkspaceRemoveParams, ctx: RequestContext) -> WorkspaceRemoveResult:
        return await workspaces.remove(p.workspace_id, force=p.force)

    async def ws_keep(p: WorkspaceIdParams, ctx: RequestContext) -> WorkspaceResult:
        return await workspaces.keep(p.workspace_id)

    async def ws_setup(p: WorkspaceIdParams, ctx: RequestContext) -> WorkspaceSetupResult:
        return await workspaces.rerun_setup(p.workspace_id)

    app.router.add(PROJECT_ADD, project_add)
    app.router.add(PROJECT_LIST, project_list)
    app.router.add(PROJECT_GET, project_get)
    app.router.add(PROJECT_REMOVE, project_remove)
    app.router.add(PROJECT_TRUST, project_trust)
    app.router.add(
        WORKSPACE_CREATE,
        ws_create,
        settle=lambda p, target: keyedcalls.created(workspaces.context, p, target),
    )
    app.router.add(WORKSPACE_LIST, ws_list)
    app.router.add(WORKSPACE_GET, ws_get)
    app.router.add(WORKSPACE_REALLOCATE_PORTS, ws_reallocate_ports)
    app.router.add(WORKSPACE_RENAME, ws_rename)
    app.router.add(
        WORKSPACE_ARCHIVE,
        ws_archive,
        settle=lambda p, target: keyedcalls.archived(workspaces.context, p, target),
    )
    app.router.add(WORKSPACE_UNARCHIVE, ws_unarchive)
    app.router.add(WORKSPACE_REMOVE, ws_remove)
    app.router.add(WORKSPACE_KEEP, ws_keep)
    app.router.add(WORKSPACE_SETUP, ws_setup)

    # -- events and status -----------------------------------------------------------------------

    def projects_snapshot() -> list[dict[str, Any]]:
        return [projects.info(r).model_dump(mode="json") for r in rows.list_projects(app.store)]

    def workspaces_snapshot() -> list[dict[str, Any]]:
        # The listing's direct path: the same values as a model per row, for a fraction.
        listed: list[dict[str, Any]] = workspaces.list_json(WorkspaceListParams())["workspaces"]
        return listed

    def workspaces_first_page(limit: int) -> tuple[list[dict[str, Any]], str | None]:
        # `workspace.list`'s own first page (its byte budget included): the subscriber goes on
        # with `workspace.list {after: next}`.
        page = workspaces.list_json(WorkspaceListParams(limit=limit))
        return page["workspaces"], page["next"]

    app.events.add_snapshot_provider("projects", projects_snapshot)
    app.events.add_paged_snapshot_provider("workspaces", workspaces_snapshot, workspaces_first_page)
    app.status_providers["lifecycle"] = coord.status
    return workspaces


def _install_pool(app: App, pool: PoolService) -> None:
    """The warm pool: its entries settled before recovery's workspace pass (installed after the
    lifecycle, so its start-up step runs after this one: a claim cut by a crash is rolled
    forward onto the workspace's checkout first), refilled in the background after readiness,
    the refill stopped at shutdown."""

    async def settle() -> None:
        counts = await pool.reconcile()
        if counts:
            logs.get("xumd.lifecycle.pool").info("pool.reconciled", **counts)

    def on_event(event: Any) -> None:
        if event.type in ("project.added", "project.removed"):  # made, or dropped, at once
            pool.wake()

    app.events.listen(on_event)
    app.on_startup("lifecycle.pool", settle)
    app.after_ready("lifecycle.pool", pool.serve)
    app.on_shutdown("lifecycle.pool", pool.stop)
