"""Install garbage collection: `gc.plan`, `gc.run` (and, with `enable_test_methods`,
`test.clock_advance`, which ages records for gc without sleeping)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from xum_protocol.models.gc import (
    GcGetParams,
    GcPlanParams,
    GcPlanResult,
    GcRunParams,
    GcRunResult,
)

from xumd.app import App
from xumd.gc.service import GcClock, GcService
from xumd.git import Git
from xumd.lifecycle.seams import LifecycleHooks
from xumd.lifecycle.service import WorkspaceService
from xumd.rpc.dispatch import RequestContext
from xumd.usage.service import UsageService


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
    hooks: LifecycleHooks,
    usage: UsageService,
    workspaces: WorkspaceService,
) -> GcService:
    clock = GcClock()
    service = app.provide(
        GcService(app, git, clock, hooks=hooks, usage=usage, workspaces=workspaces)
    )

    async def gc_plan(p: GcPlanParams, ctx: RequestContext) -> GcPlanResult:
        return await service.plan()

    async def gc_run(p: GcRunParams, ctx: RequestContext) -> GcRunResult:
        return await service.run(p)

    async def gc_get(p: GcGetParams, ctx: RequestContext) -> GcRunResult:
        return service.get(p.run_id)

    app.router.add("gc.plan", gc_plan)
    app.router.add("gc.run", gc_run)
    app.router.add("gc.get", gc_get)
    app.after_ready("gc.worker", service.serve)
    app.on_shutdown("gc.worker", service.stop)
    if app.config.enable_test_methods:

        async def advance(p: _Advance, ctx: RequestContext) -> BaseModel:
            return _Now(now=clock.advance(p.seconds))

        app.router.add("test.clock_advance", advance, _Advance)
    return service
