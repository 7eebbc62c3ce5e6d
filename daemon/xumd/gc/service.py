"""`gc.plan` and `gc.run`. A run plans afresh (the world may have changed since the caller's
plan) and collects each item through the lifecycle operation a user would call: `workspace.remove`,
`workspace.archive`, `workspace.discard_kept` (their reservations, quiescence and not-safe checks,
their durable intent and recovery), or a compare-and-delete of a snapshot ref. Each item is one
such operation: a crash mid-run leaves at most the item in flight mid-way, and the startup pass
settles it as it settles that operation anywhere; the next run plans from what is then true.
Runs are one at a time (a second is `busy` at once). A refusal is reported, never retried
blindly: busy, unsaved or not provably stale is left alone."""

from __future__ import annotations

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.gc import (
    GcDone,
    GcItem,
    GcPlanResult,
    GcRunParams,
    GcRunResult,
    GcSkipped,
)

from xumd import logs
from xumd.app import App
from xumd.errors import XumError
from xumd.gc.clock import GcClock
from xumd.gc.plan import Plan, Planner, policies
from xumd.git import Git
from xumd.lifecycle import rows
from xumd.lifecycle.seams import LifecycleHooks
from xumd.lifecycle.service import WorkspaceService
from xumd.recovery.feature import discard_kept_copy
from xumd.usage.service import UsageService

log = logs.get("xumd.gc")


class GcService:
    def __init__(self, app: App, git: Git, clock: GcClock) -> None:
        self.app = app
        self.git = git
        self.clock = clock
        self._running = anyio.Lock()

    def _planner(self) -> Planner:
        return Planner(
            self.app.store,
            self.app.paths,
            self.git,
            self.app.find(LifecycleHooks) or LifecycleHooks(),
            self.app.get(UsageService),
            self.app.config.gc,
            self.app.config.usage.deadline_s,
        )

    async def plan(self) -> GcPlanResult:
        return self._result(await self._planner().plan(self.clock.time()))

    def _result(self, plan: Plan) -> GcPlanResult:
        return GcPlanResult(
            policies=policies(self.app.config.gc),
            now=plan.now,
            items=plan.items,
            skipped=plan.skipped,
            bytes=sum(i.bytes for i in plan.items),
        )

    async def run(self, params: GcRunParams) -> GcRunResult:
        if self._running.locked():
            raise XumError(ErrorKind.BUSY, "a gc run is in progress; retry when it ends")
        async with self._running:
            plan = await self._planner().plan(self.clock.time())
            result = GcRunResult(skipped=list(plan.skipped))
            chosen = plan.items
            if params.keys is not None:
                wanted = set(params.keys)
                chosen = [i for i in plan.items if i.key in wanted]
                planned = {i.key for i in plan.items} | {s.key for s in plan.skipped}
                for key in params.keys:
                    if key not in planned:
                        result.skipped.append(_gone(key))
                result.skipped = [s for s in result.skipped if s.key in wanted]
            for item in chosen:
                await self._one(item, result)
            result.bytes = sum(d.bytes for d in result.done)
            log.info("gc.ran", done=len(result.done), skipped=len(result.skipped))
            return result

    async def _one(self, item: GcItem, result: GcRunResult) -> None:
        try:
            detail = await self._collect(item)
        except XumError as exc:
            log.info("gc.item_skipped", key=item.key, kind=exc.kind.value)
            result.skipped.append(
                GcSkipped(
                    key=item.key,
                    action=item.action,
                    workspace_id=item.workspace_id,
                    name=item.name,
                    reason=exc.message,
                    kind=exc.kind.value,
                )
            )
            return
        log.info("gc.item_done", key=item.key, action=item.action)
        result.done.append(
            GcDone(
                key=item.key,
                action=item.action,
                workspace_id=item.workspace_id,
                name=item.name,
                bytes=item.bytes,
                detail=detail,
            )
        )

    async def _collect(self, item: GcItem) -> str:
        workspaces = self.app.get(WorkspaceService)
        if item.action == "remove_archived" and item.workspace_id:
            removed = await workspaces.remove(item.workspace_id, force=False)
            return f"removed; cleanup {removed.cleanup.status}"
        if item.action == "archive_merged" and item.workspace_id:
            archived = await workspaces.archive(item.workspace_id)
            return f"archived; cleanup {archived.cleanup.status}"
        if item.action == "discard_kept" and item.path:
            discarded = await discard_kept_copy(self.app, item.path)
            return f"discarded {discarded.files} file(s)"
        if item.action == "prune_snapshot_ref" and item.ref and item.project_id and item.commit:
            return await self._prune_ref(item)
        raise XumError(ErrorKind.INTERNAL, f"gc item {item.key} cannot be collected")

    async def _prune_ref(self, item: GcItem) -> str:
        assert item.ref is not None and item.project_id is not None and item.commit is not None
        commit = item.commit
        project = rows.get_project(self.app.store, item.project_id)
        if project is None:
            raise XumError(ErrorKind.NOT_FOUND, f"project {item.project_id} is gone")
        async with self.git.admin_lock(project.path):
            # Compare-and-delete: a ref that moved since the plan is someone's new work.
            await self.git.run(
                project.path, "update-ref", "-d", item.ref, commit, what="git update-ref -d"
            )
        return f"deleted {item.ref} ({commit[:12]})"


def _gone(key: str) -> GcSkipped:
    action = key.split(":", 1)[0]
    known = ("remove_archived", "prune_snapshot_ref", "archive_merged", "discard_kept")
    return GcSkipped(
        key=key,
        action=action if action in known else "remove_archived",
        reason="no longer planned (the workspace changed, or another run collected it)",
    )
