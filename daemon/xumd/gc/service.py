"""`gc.plan` and `gc.run`. A run plans afresh (the world may have changed since the caller's
plan) and collects each item through the lifecycle operation a user would call: `workspace.remove`,
`workspace.archive`, `workspace.discard_kept` (their reservations, quiescence and not-safe checks,
their durable intent and recovery), or a compare-and-delete of a snapshot ref. Each item is one
such operation: a crash mid-run leaves at most the item in flight mid-way, and the startup pass
settles it as it settles that operation anywhere; the next run plans from what is then true.
Runs are one at a time (a second is `busy` at once). A refusal is reported, never retried
blindly: busy, unsaved or not provably stale is left alone.

A background run (`background: true`) is a `gc_runs` row committed before it starts; the
worker (after readiness) runs the oldest `running` row and commits its result. A run a crash
or a stop cut short is still `running` at the next start, and runs then, after the startup
pass settled whatever item was mid-way."""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, get_args

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.cleanup import CleanupStatus
from xum_protocol.models.gc import (
    GcAction,
    GcBudget,
    GcDone,
    GcItem,
    GcPlanParams,
    GcPlanResult,
    GcRunParams,
    GcRunResult,
    GcSkipped,
)
from xum_protocol.models.usage import WorkspaceUsageParams
from xum_protocol.models.workspace import WorkspaceArchiveResult, WorkspaceRemoveResult

from xumd.app import App
from xumd.base import logs
from xumd.base.errors import XumError
from xumd.cleanup.obligations import Obligations
from xumd.gc import budgetsteps, evict, pool, runs
from xumd.gc.budget import describe, measure, mount_of, with_need
from xumd.gc.evict import Evictor
from xumd.gc.evictplan import ACTION as EVICT
from xumd.gc.evictplan import Activity, plan_evictions
from xumd.gc.plan import Holders, Plan, Planner, policies, skipped
from xumd.lifecycle import rows
from xumd.lifecycle.capacity import Made
from xumd.lifecycle.rootbytes import RootBytes
from xumd.recovery.feature import discard_kept_copy
from xumd.system import procstat
from xumd.system.git import Git
from xumd.usage.service import UsageService

log = logs.get("xumd.gc")

RUN_PREFIX = "gc_"


ANCHOR_SLACK_S = 2.0


class GcClock:
    """The clock gc ages records by. Records carry wall-clock stamps; a wall-clock step (NTP's
    first sync, a hand-set clock, a VM restored) would make them look older or younger than
    they are. So "now" is the earlier of the wall clock and the boot-anchored clock
    (`procstat.anchored_now`: fixed to the wall clock once per boot, then moved only by real
    time, suspend included). A step ahead moves only the wall clock: the anchored one keeps the
    true time, and nothing looks older than it is. A step back moves the wall clock behind the
    anchored one: the wall clock is then the earlier. Either way an age is never overstated,
    and it is understated by at most the step (within this boot), so nothing is kept forever:
    a record stamped after the gc clock's now is skipped, naming the step (`Planner`), until
    the clock passes it. Plus an offset that only a test method (`test.clock_advance`, with
    `enable_test_methods`) moves, so tests age records without sleeping."""

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        anchored: Callable[[], float] = procstat.anchored_now,
    ) -> None:
        self.offset_s = 0.0
        self._wall = wall
        self._anchored = anchored

    def time(self) -> float:
        wall, anchored = self._wall(), self._anchored()
        # The anchor is the kernel's boot time in whole seconds: the anchored clock may trail
        # the wall clock by up to a second with no step at all, which is not a step ahead.
        now = anchored if wall - anchored > ANCHOR_SLACK_S else wall
        return now + self.offset_s

    def advance(self, seconds: float) -> float:
        self.offset_s += seconds
        return self.time()


class Collected(pool.PoolEntries, Protocol):
    """The lifecycle operations gc collects through (`WorkspaceService`): the same
    reservation, quiescence check and snapshot as a user's call (and the warm pool's drop)."""

    async def remove(
        self, workspace_id: str, force: bool = False, *, expect_state: str | None = None
    ) -> WorkspaceRemoveResult: ...

    async def archive(self, workspace_id: str, stop: bool = False) -> WorkspaceArchiveResult: ...


class Reclaims(Protocol):
    """The cleanup, as an eviction wakes it (`CleanupService.poke`: its reclaim is due) and as
    a create making room runs what is owed now (`run_workspace`: the trash reclaimed)."""

    def poke(self, lane: str | None = None) -> None: ...

    async def run_workspace(
        self,
        workspace_id: str,
        *,
        force: bool = False,
        include_reclaim: bool = False,
        wait_s: float | None = None,
    ) -> CleanupStatus: ...


@dataclass(slots=True)
class Planned:
    plan: Plan
    budget: list[GcBudget]
    unmet: list[GcBudget]


class GcService:
    def __init__(
        self,
        app: App,
        git: Git,
        clock: GcClock,
        *,
        hooks: Holders,
        usage: UsageService,
        workspaces: Collected,
        reclaims: Reclaims,
        ledger: RootBytes,
    ) -> None:
        self.app = app
        self.ledger = ledger
        """The root's bytes as last measured: every measurement of the budget is recorded
        there, for the creates' cheap figure (lifecycle/rootbytes.py)."""
        self.git = git
        self.clock = clock
        self.hooks = hooks
        self.usage = usage
        self.workspaces = workspaces
        self.activity = Activity()
        self.reclaims = reclaims
        self.evictor = Evictor(app, git, hooks, reclaims.poke)
        self.unmet_reported = False
        """A budget that cannot be met is reported once per episode (until it holds again)."""
        self.budget_line = "not checked yet"
        """The budget's state as last measured, in one line (`daemon.status`)."""
        self._running = anyio.Lock()
        self._checking = False
        """The lock is held by a budget check or a create's room: short, waited for by a run."""
        self._wake = anyio.Event()
        self._scope: anyio.CancelScope | None = None
        self._stopped: anyio.Event | None = None

    def _planner(self) -> Planner:
        return Planner(
            self.app.store,
            self.app.paths,
            self.git,
            self.hooks,
            self.usage,
            self.app.config.gc,
        )

    async def plan(self, params: GcPlanParams) -> GcPlanResult:
        if params.budget_only:
            budget = await measure(self.app, self.usage, ledger=self.ledger)
            return self._result(Planned(Plan(self.clock.time()), budget.parts, []))
        return self._result(await self._plan())

    async def _plan(
        self,
        keys: frozenset[str] | None = None,
        *,
        budget_only: bool = False,
        need: tuple[str, int] | None = None,
        project_id: str | None = None,
        refresh: bool = False,
    ) -> Planned:
        """The policies' items (unless `budget_only`), then, while a disk budget is exceeded
        (with `need`: as it would be after that many bytes are written on that mount, and with
        `project_id` one more workspace of that project), what restores it, in order: the warm
        pool's surplus, rebuildable directories, archived workspaces' lingering checkouts, idle
        clean workspaces archived (gc/budgetsteps.py). `refresh`: every checkout walked anew."""
        planner = self._planner()
        now = self.clock.time()
        plan = Plan(now, keys) if budget_only else await planner.plan(now, keys)
        if not budget_only:
            await pool.plan_items(plan, self.workspaces, self.usage)
        budget = await measure(self.app, self.usage, ledger=self.ledger, refresh=refresh)
        if need is not None:
            most = self.app.config.gc.max_workspaces
            project = (project_id, most) if project_id is not None and most else None
            budget = with_need(budget, *need, project=project)
        await pool.plan_pressure(plan, budget, self.workspaces, self.usage)
        unmet = await plan_evictions(planner, plan, budget, self.activity)
        counts = [p for p in budget.exceeded() if p.what == "workspaces"]
        # With `refresh` and `max_bytes`, the measurement just walked every checkout anew.
        walked = refresh and bool(self.app.config.gc.max_bytes)
        unmet = await budgetsteps.plan_lingering(planner, plan, unmet + counts, walked=walked)
        unmet = await budgetsteps.plan_idle_archives(
            planner, plan, unmet, self.activity, walked=walked
        )
        if need is None:  # a create's hypothetical budget is not the state
            self.budget_line = describe(budget.parts, unmet)
        return Planned(plan, budget.parts, unmet)

    def _result(self, planned: Planned) -> GcPlanResult:
        plan = planned.plan
        return GcPlanResult(
            policies=policies(self.app.config.gc),
            now=plan.now,
            items=plan.items,
            skipped=plan.skipped,
            bytes=sum(i.bytes for i in plan.items),
            budget=planned.budget,
            unmet_bytes=sum(p.deficit_bytes for p in planned.unmet),
        )

    async def enforce(self) -> GcRunResult | None:
        """A scheduled (or after-create) check: while a budget is exceeded, collect the
        evictions that restore it. A budget still unmet afterwards (what is left is busy,
        unsaved or not rebuildable) is reported once per episode, never retried in a loop: the
        next check is the next interval's."""
        if not self.app.config.gc.budgeted() or self._running.locked():
            return None
        async with self._budget_work():
            planned = await self._plan(budget_only=True)
            result = GcRunResult(skipped=list(planned.plan.skipped))
            for item in planned.plan.items:
                await self._one(item, result)
            result.bytes = sum(d.bytes for d in result.done)
        log.debug("gc.budget_checked", unmet=bool(planned.unmet), done=len(result.done))
        if not planned.unmet:
            self.unmet_reported = False
            return result
        exceeded = [p for p in planned.budget if p.deficit_bytes > p.pending_bytes]
        if not self.unmet_reported:
            self.unmet_reported = True
            largest = await self._largest(result.skipped)
            log.warning(
                "gc.budget_exceeded",
                unmet=sum(p.deficit_bytes for p in planned.unmet),
                filesystems=[p.filesystem for p in exceeded],
                holders=[s.workspace_id for s in largest],
            )
            self.app.events.publish(
                "gc.budget_exceeded",
                budget=[p.model_dump(mode="json") for p in exceeded],
                unmet_bytes=sum(p.deficit_bytes for p in planned.unmet),
                freed_bytes=result.bytes,
                holders=[s.model_dump(mode="json") for s in largest],
            )
        return result

    async def make_room(self, path: Path, need: int, *, project_id: str | None = None) -> Made:
        """For a create about to write `need` bytes at `path` (with `project_id`: one more
        workspace of that project): what is owed is reclaimed now, then what the budget's
        policy allows is collected until the budget would hold after the create (each item as
        `gc.run` collects it), and reclaimed now. The root is measured with every checkout
        walked anew (and again after anything was collected), so the create decides on a
        measurement. Waits for a run in progress (the create's wait is bounded: gc/room.py)."""
        async with self._budget_work():
            owed = await self._reclaim_owed()
            planned = await self._plan(
                budget_only=True,
                need=(mount_of(path), need),
                project_id=project_id,
                refresh=True,
            )
            result = GcRunResult(done=owed, skipped=list(planned.plan.skipped))
            for item in planned.plan.items:
                await self._one(item, result)
            if len(result.done) > len(owed):
                result.done.extend(await self._reclaim_owed())
                if self.app.config.gc.max_bytes:
                    await measure(self.app, self.usage, ledger=self.ledger, refresh=True)
        log.info(
            "gc.made_room",
            path=str(path),
            need=need,
            project=project_id,
            collected=len(result.done),
            freed=sum(d.bytes for d in result.done),
        )
        return Made(evicted=result.done, held=[f"{s.key}: {s.reason}" for s in result.skipped])

    async def measure_root(self) -> None:
        """For a create with no recent figure of the root's bytes: measured now and recorded
        (no lock: a measurement changes nothing)."""
        if self.app.config.gc.max_bytes:
            await measure(self.app, self.usage, ledger=self.ledger)

    async def _reclaim_owed(self) -> list[GcDone]:
        """Every pending reclaim run now, in full: the trash entries' bytes freed, not owed.
        A workspace's pending cleanup runs whole, so an archived workspace's checkout still on
        disk goes with it: each such checkout gone is told (`collect_checkout`, with the bytes
        it held), as gc's own collection of it would be."""
        owed = Obligations(self.app.store).list(workspace_id=None, state="pending", limit=10_000)
        done: list[GcDone] = []
        for workspace_id in sorted({ob.workspace_id for ob in owed if ob.kind == "reclaim"}):
            row = rows.get_workspace(self.app.store, workspace_id)
            lingering = row is not None and row.state == "archived" and row.path.is_dir()
            held = 0
            if row is not None and lingering:
                # Told, never checked against anything: a recent walk's figure when there is
                # one (the plan just sized a lingering checkout it chose), else a plain walk.
                figures = self.usage.cached(row) or await self.usage.measure(row.path)
                held = figures.bytes
            await self.reclaims.run_workspace(workspace_id, force=True, include_reclaim=True)
            if row is not None and lingering and not os.path.lexists(row.path):
                log.info(
                    "gc.item_done",
                    key=f"{budgetsteps.COLLECT}:{row.id}",
                    action=budgetsteps.COLLECT,
                )
                done.append(
                    GcDone(
                        key=f"{budgetsteps.COLLECT}:{row.id}",
                        action=budgetsteps.COLLECT,
                        workspace_id=row.id,
                        name=row.name,
                        bytes=held,
                        detail="its pending cleanup ran (owed before anything was chosen)",
                    )
                )
        return done

    @asynccontextmanager
    async def _budget_work(self) -> AsyncIterator[None]:
        """The lock, held for the budget's own work (a check, a create's room): a run asked for
        meanwhile waits for it rather than being refused `busy`."""
        async with self._running:
            self._checking = True
            try:
                yield
            finally:
                self._checking = False

    def wake(self) -> None:
        """A create wrote: the worker checks the budget now (not before its running item)."""
        self._wake.set()

    async def _largest(self, left: list[GcSkipped], most: int = 10) -> list[GcSkipped]:
        """The workspaces left alone, largest checkout first (the usage walk's figures)."""
        listed = await self.usage.usage(WorkspaceUsageParams())
        sizes = {w.workspace_id: w.usage.bytes if w.usage else 0 for w in listed.workspaces}
        held = {s.workspace_id: s for s in left if s.workspace_id}
        order = sorted(held, key=lambda w: (-sizes.get(w, 0), w))
        return [held[w] for w in order[:most]]

    # -- background runs ------------------------------------------------------------------------

    def start_background(self, params: GcRunParams) -> GcRunResult:
        run_id = RUN_PREFIX + secrets.token_hex(8)
        now = self.clock.time()
        keys = json.dumps(params.keys) if params.keys is not None else None
        with self.app.store.transaction():
            runs.insert_running(self.app.store, run_id, keys, now)
        log.info("gc.run_queued", run=run_id)
        self._wake.set()
        return GcRunResult(run_id=run_id, state="running")

    def get(self, run_id: str) -> GcRunResult:
        if not run_id.startswith(RUN_PREFIX):
            raise XumError(ErrorKind.INVALID_SCOPE, f"{run_id!r} is not a gc run id", id=run_id)
        row = runs.get(self.app.store, run_id)
        if row is None:
            raise XumError(ErrorKind.NOT_FOUND, f"gc run {run_id!r} not found", id=run_id)
        if row["state"] != "done":
            return GcRunResult(run_id=run_id, state="running")
        done = GcRunResult.model_validate(json.loads(row["result"]))
        return done.model_copy(update={"run_id": run_id, "state": "done"})

    async def serve(self) -> None:
        """After readiness: run every recorded `running` run, oldest first, then wait; with a
        disk budget set, check it every `budget_interval_s` (and when woken after a create)."""
        self._stopped = anyio.Event()
        evict.settle(self.app, time.time())
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                while True:
                    row = runs.oldest_running(self.app.store)
                    if row is None:
                        await self._idle()
                        continue
                    keys = json.loads(row["keys"]) if row["keys"] is not None else None
                    async with self._running:
                        try:
                            result = await self._collect_all(GcRunParams(keys=keys))
                        except Exception as exc:  # a broken plan must not end the worker
                            log.warning("gc.run_failed", run=row["id"], error=repr(exc))
                            result = GcRunResult(
                                skipped=[
                                    GcSkipped(
                                        key="plan",
                                        action="plan",
                                        reason=f"the plan failed: {type(exc).__name__}: {exc}",
                                        kind=ErrorKind.INTERNAL.value,
                                    )
                                ]
                            )
                    with self.app.store.transaction():
                        runs.finish(
                            self.app.store, row["id"], result.model_dump_json(), self.clock.time()
                        )
                    log.info("gc.run_finished", run=row["id"], done=len(result.done))
        finally:
            self._stopped.set()

    async def _idle(self) -> None:
        self._wake = anyio.Event()
        config = self.app.config.gc
        if not config.budgeted():
            await self._wake.wait()
            return
        with anyio.move_on_after(config.budget_interval_s):
            await self._wake.wait()
        try:
            await self.enforce()
        except Exception as exc:  # a failed check must not end the worker
            log.warning("gc.budget_check_failed", error=repr(exc))

    async def stop(self) -> None:
        """A run in progress is cut (each operation undoes or settles itself); its row stays
        `running` and resumes at the next start."""
        if self._scope is not None:
            self._scope.cancel()
        if self._stopped is not None:
            await self._stopped.wait()

    # -- a run --------------------------------------------------------------------------------

    async def run(self, params: GcRunParams) -> GcRunResult:
        for key in params.keys or ():
            # A key no plan can hold (not `<action>:<what>`) is a mistake, not a world that
            # changed: refused before anything runs, where it was reported `remove_archived`.
            action, sep, what = key.partition(":")
            if not (sep and what) or action not in get_args(GcAction):
                raise XumError(
                    ErrorKind.INVALID_PARAMS,
                    f"{key!r} is not a gc plan key (`<action>:<what>`, the `key` of a"
                    f" `gc.plan` item; actions: {', '.join(get_args(GcAction))})",
                    key=key,
                )
        if params.background:
            return self.start_background(params)
        if self._running.locked() and not self._checking:
            raise XumError(ErrorKind.BUSY, "a gc run is in progress; retry when it ends")
        async with self._running:
            return await self._collect_all(params)

    async def _collect_all(self, params: GcRunParams) -> GcRunResult:
        keys = frozenset(params.keys) if params.keys is not None else None
        plan = (await self._plan(keys)).plan
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
            result.skipped.append(skipped(item, exc.message, exc.kind.value))
            return
        except Exception as exc:  # one broken item must not end the run
            log.warning("gc.item_failed", key=item.key, error=repr(exc))
            reason = f"failed: {type(exc).__name__}: {exc}"
            result.skipped.append(skipped(item, reason, ErrorKind.INTERNAL.value))
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
        workspaces = self.workspaces
        if item.action == "remove_archived" and item.workspace_id:
            removed = await workspaces.remove(
                item.workspace_id, force=False, expect_state="archived"
            )
            return f"removed; cleanup {removed.cleanup.status}"
        if item.action == "archive_merged" and item.workspace_id:
            archived = await workspaces.archive(item.workspace_id)
            return f"archived; cleanup {archived.cleanup.status}"
        if item.action == "discard_kept" and item.path:
            discarded = await discard_kept_copy(self.app, item.path)
            return f"discarded {discarded.files} file(s)"
        if (
            item.action in ("prune_snapshot_ref", "prune_carry_ref")
            and item.ref
            and item.project_id
            and item.commit
        ):
            return await self._prune_ref(item)
        if item.action == pool.ACTION:
            return await pool.collect(item, workspaces)
        if item.action == budgetsteps.COLLECT and item.workspace_id:
            return await self._collect_checkout(item.workspace_id)
        if item.action == budgetsteps.ARCHIVE and item.workspace_id:
            archived = await workspaces.archive(item.workspace_id)
            return f"archived; cleanup {archived.cleanup.status}"
        if item.action == EVICT and item.workspace_id:
            rel = item.key.split(":", 2)[2]
            return await self.evictor.evict(item.workspace_id, rel, item.bytes)
        raise XumError(ErrorKind.INTERNAL, f"gc item {item.key} cannot be collected")

    async def _collect_checkout(self, workspace_id: str) -> str:
        """An archived workspace's pending cleanup, run now in full (its own checks apply)."""
        row = rows.get_workspace(self.app.store, workspace_id)
        if row is None or row.state != "archived":
            raise XumError(
                ErrorKind.INVALID_STATE, f"workspace {workspace_id} is no longer archived"
            )
        status = await self.reclaims.run_workspace(workspace_id, force=True, include_reclaim=True)
        if os.path.lexists(row.path):
            raise XumError(
                ErrorKind.BUSY,
                f"its cleanup did not remove {row.path}: {status.status}"
                + (f" ({status.reason})" if status.reason else ""),
            )
        return f"its checkout removed; cleanup {status.status}"

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
    return GcSkipped(
        key=key,
        action=action if action in get_args(GcAction) else "remove_archived",
        reason="no longer planned (the workspace changed, or another run collected it)",
    )
