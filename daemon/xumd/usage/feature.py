"""Install disk usage: `workspace.usage`.

No startup step needs it: its service (and the walk) is imported and built at the first request
that needs it (`rpc.deferred`), not before readiness."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xum_protocol.models.usage import (
    WORKSPACE_USAGE,
    WorkspaceUsageParams,
    WorkspaceUsageResult,
)

from xumd.app import App
from xumd.rpc.deferred import Deferred
from xumd.rpc.dispatch import RequestContext
from xumd.system.git import Git

if TYPE_CHECKING:
    from xumd.usage.service import PendingReclaims, PoolEntries, UsageService


def install(
    app: App, *, git: Git, reclaims: PendingReclaims, pool: PoolEntries
) -> Deferred[UsageService]:
    def build() -> UsageService:
        from xumd.usage.service import UsageService

        return app.provide(UsageService(app, git, reclaims, pool))

    usage = Deferred("usage", build)

    async def ws_usage(
        service: UsageService, p: WorkspaceUsageParams, ctx: RequestContext
    ) -> WorkspaceUsageResult:
        return await service.usage(p)

    app.router.add(WORKSPACE_USAGE, usage.route(ws_usage))
    return usage
