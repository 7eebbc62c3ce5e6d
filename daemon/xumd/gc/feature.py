"""Install garbage collection: `gc.plan`, `gc.run` (and, with `enable_test_methods`,
`test.clock_advance`, which ages records for gc without sleeping).

No startup step needs gc: its service (the planner, the usage walk) is imported and built at the
first request that names a gc method (`rpc.deferred`), not before readiness. The worker that
resumes `running` runs builds it at once if the store holds one, else waits for the first build.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field
from xum_protocol.models.gc import (
    GC_GET,
    GC_PLAN,
    GC_RUN,
    GcGetParams,
    GcPlanParams,
    GcPlanResult,
    GcRunParams,
    GcRunResult,
)

from xumd.app import App
from xumd.base.errors import XumError
from xumd.gc import runs
from xumd.gc.room import Room
from xumd.lifecycle.rootbytes import RootBytes
from xumd.rpc.deferred import Deferred
from xumd.rpc.dispatch import RequestContext
from xumd.system.git import Git

if TYPE_CHECKING:
    from xumd.gc.plan import Holders
    from xumd.gc.service import Collected, GcService, Reclaims
    from xumd.usage.service import UsageService


def room(app: App) -> Room:
    """The lifecycle's `MakeRoom` port, built before the workspace service and gc both (gc
    serves it once installed)."""
    return Room(
        wait_s=app.config.git_timeout_s,
        ledger=RootBytes(app.store, walked=bool(app.config.gc.max_bytes)),
    )


# Test-method models (enable_test_methods only): built on first use, not at every start-up.
class _Advance(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    seconds: float = Field(ge=0)


class _Now(BaseModel):
    model_config = ConfigDict(defer_build=True)
    now: float


def install(
    app: App,
    *,
    git: Git,
    hooks: Holders,
    usage: Deferred[UsageService],
    workspaces: Collected,
    reclaims: Reclaims,
    room: Room,
) -> Deferred[GcService]:
    def build() -> GcService:
        from xumd.gc.service import GcClock, GcService

        return app.provide(
            GcService(
                app,
                git,
                GcClock(),
                hooks=hooks,
                usage=usage.get("gc"),
                workspaces=workspaces,
                reclaims=reclaims,
                ledger=room.ledger,
            )
        )

    gc = Deferred("gc", build)

    async def gc_plan(service: GcService, p: GcPlanParams, ctx: RequestContext) -> GcPlanResult:
        return await service.plan(p)

    async def gc_run(service: GcService, p: GcRunParams, ctx: RequestContext) -> GcRunResult:
        return await service.run(p)

    async def gc_get(service: GcService, p: GcGetParams, ctx: RequestContext) -> GcRunResult:
        return service.get(p.run_id)

    async def worker() -> None:
        # A run recorded `running` (cut by the last stop) resumes now, and a disk budget is
        # kept from the start; otherwise the worker has nothing to do until a request builds
        # the service (a background run wakes it).
        service = None
        if runs.any_running(app.store) or app.config.gc.budgeted():
            try:
                service = gc.get("gc.worker")
            except XumError:
                # Logged by the build. The worker must not end here: the run stays recorded
                # `running`, and the first request that builds gc brings the worker back to it.
                service = None
        if service is None:
            service = await gc.wait()
        if not app.stopping:
            await service.serve()

    async def stop() -> None:
        if gc.built is not None:
            await gc.built.stop()

    app.router.add(GC_PLAN, gc.route(gc_plan))
    app.router.add(GC_RUN, gc.route(gc_run))
    app.router.add(GC_GET, gc.route(gc_get))
    app.after_ready("gc.worker", worker)

    async def serve_room() -> None:
        await room.serve(build=lambda: gc.get("workspace.create"), built=lambda: gc.built)

    app.after_ready("gc.room", serve_room)

    def status() -> dict[str, str]:
        # One line, as `GcStatus` (models/daemon.py) writes it; no model loaded here.
        if not app.config.gc.budgeted():
            return {"budget": "off"}
        line = gc.built.budget_line if gc.built is not None else "not checked yet"
        held = workspaces.pool_held_back()
        if held:
            line += f"; the warm pool's refill is held back for {', '.join(sorted(held))}"
        return {"budget": line}

    app.status_providers["gc"] = status
    app.on_shutdown("gc.worker", stop)
    if app.config.enable_test_methods:

        async def advance(service: GcService, p: _Advance, ctx: RequestContext) -> BaseModel:
            return _Now(now=service.clock.advance(p.seconds))

        app.router.add("test.clock_advance", gc.route(advance), _Advance)
    return gc
