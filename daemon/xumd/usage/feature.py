"""Install disk usage: `workspace.usage`."""

from __future__ import annotations

from xum_protocol.models.usage import WorkspaceUsageParams, WorkspaceUsageResult

from xumd.app import App
from xumd.cleanup.service import CleanupService
from xumd.git import Git
from xumd.lifecycle.service import WorkspaceService
from xumd.rpc.dispatch import RequestContext
from xumd.usage.service import UsageService


def install(
    app: App, *, git: Git, workspaces: WorkspaceService, cleanup: CleanupService
) -> UsageService:
    service = app.provide(UsageService(app, git, workspaces, cleanup))

    async def ws_usage(p: WorkspaceUsageParams, ctx: RequestContext) -> WorkspaceUsageResult:
        return await service.usage(p)

    app.router.add("workspace.usage", ws_usage)
    return service
