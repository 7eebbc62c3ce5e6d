"""CleanupService: plans obligations (inside the caller's transaction), runs them in order, fenced,
under the directory exclusion, and records every outcome (completed, pending with backoff, or
abandoned with a reason). It is cleanup-only: it never archives, never removes a workspace row, and
never acts on a live workspace (see fence.py).

A facade over parts with one responsibility each: planning.py (what is owed), runner.py (one
workspace's steps in order, per-lane locks), cycle.py (the lanes' background cycles), outcomes.py
(recording and announcing), status.py (what is reported), teardown_scripts.py (the teardown
the feature builds on the script runner). What a step needs from outside (the directory
exclusion, the teardown, git, the lifecycle's comparison of a lingering checkout with its
archive, a workspace's variables) is a required argument, handed in by the composition root;
cleanup imports nothing of the lifecycle feature. The lanes
(schedule.py): `path` (teardown, trash: what frees the path) and `reclaim` (deleting trash
entries, which may take minutes), so a large reclaim never delays another workspace's path.
"""

from __future__ import annotations

import random
from pathlib import Path

import anyio
from xum_protocol.models.cleanup import CleanupStatus, CleanupSummary

from xumd.app import App
from xumd.base import logs
from xumd.checkouts.exclusion import DirectoryExclusion
from xumd.cleanup import status as status_mod
from xumd.cleanup.cycle import CycleResult, LaneCycles
from xumd.cleanup.fence import WorkspaceRecords
from xumd.cleanup.obligations import Obligations
from xumd.cleanup.outcomes import OutcomeRecorder, RememberCleanup
from xumd.cleanup.planning import Planner, TeardownEnv
from xumd.cleanup.runner import StepRunner
from xumd.cleanup.schedule import (
    LANES,
    PATH_LANE,
    RECLAIM_LANE,
    Backoff,
    Clock,
    LaneWake,
    ScheduleClock,
    SystemClock,
)
from xumd.cleanup.steps import Steps, TeardownFn, UnsavedWork
from xumd.cleanup.teardown_scripts import SETUP_NEVER_RAN
from xumd.system.git import Git

__all__ = [
    "KEEP_ABANDONED_S",
    "KEEP_COMPLETED_S",
    "LANES",
    "PATH_LANE",
    "RECLAIM_LANE",
    "SETUP_NEVER_RAN",
    "CleanupService",
    "CycleResult",
]

log = logs.get("xumd.cleanup")

KEEP_COMPLETED_S = 24 * 3600.0
KEEP_ABANDONED_S = 7 * 24 * 3600.0


class CleanupService:
    def __init__(
        self,
        app: App,
        *,
        unsaved: UnsavedWork,
        teardown_env: TeardownEnv,
        remember_cleanup: RememberCleanup,
        records: WorkspaceRecords,
        teardown: TeardownFn,
        git: Git,
        directories: DirectoryExclusion,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.app = app
        self.store = app.store
        self.config = app.config.cleanup
        # Every part reads time through it, so whatever they write is on the stored due
        # times' scale, even between a wall-clock step and its re-anchoring (schedule.py).
        self.clock = ScheduleClock(clock or SystemClock())
        self.backoff = Backoff(
            self.config.backoff_initial_s,
            self.config.backoff_max_s,
            self.config.backoff_jitter,
            rng or random.Random(),
        )
        self.obligations = Obligations(app.store)
        self.records = records
        self.steps = Steps(
            self.obligations,
            trash_dir=app.paths.trash,
            git=git,
            teardown=teardown,
            unsaved=unsaved,
            records=records,
            now=self.clock.time,
        )
        self.wake = LaneWake()
        self.recorder = OutcomeRecorder(
            app.store,
            self.obligations,
            app.events,
            self.backoff,
            self.clock,
            poke=self.wake.poke,
            remember=remember_cleanup,
        )
        self.planner = Planner(
            app.store,
            self.obligations,
            self.recorder,
            self.clock,
            trash_dir=app.paths.trash,
            teardown_env=teardown_env,
            records=records,
        )
        self.runner = StepRunner(
            obligations=self.obligations,
            steps=self.steps,
            recorder=self.recorder,
            # The lifecycle's own: a path is never trashed while an operation works on it.
            directories=directories,
            backoff=self.backoff,
            clock=self.clock,
            config=self.config,
            stopping=lambda: app.stopping,
        )
        self.cycles = LaneCycles(self.obligations, self.runner, self.clock, self.config)
        # Planning runs inside the caller's transaction, no await (planning.py); the planner's
        # own method, not a wrapper restating its long signature.
        self.plan_checkout_removal = self.planner.plan_checkout_removal

    def poke(self, lane: str | None = None) -> None:
        """Wake a lane's background cycle (new work, or a blocker finished)."""
        self.wake.poke(lane)

    # -- announcing what was planned -------------------------------------------------------------

    def flush_announcements(self) -> None:
        """Publish the creation of obligations planned in a transaction that has committed."""
        self.recorder.flush()

    # -- running -----------------------------------------------------------------------------------

    async def run_workspace(
        self,
        workspace_id: str,
        *,
        force: bool = False,
        include_reclaim: bool = False,
        wait_s: float | None = None,
    ) -> CleanupStatus:
        """Attempt this workspace's due steps now, in order (each fenced), and return its status.
        Reclaim is left to the background lane unless `include_reclaim`."""
        self.reanchor()
        self.flush_announcements()
        lanes = [PATH_LANE, RECLAIM_LANE] if include_reclaim else [PATH_LANE]
        for lane in lanes:
            lock = self.runner.lock(workspace_id, lane)
            # Another task (the background lane, another request) may be running these very
            # steps: wait for it, bounded; if it takes longer, answer with the status as it is.
            acquired = False
            with anyio.move_on_after(wait_s if wait_s is not None else self.config.step_timeout_s):
                await lock.acquire()
                acquired = True
            if not acquired:
                continue
            try:
                await self.runner.run_steps(workspace_id, lane, force=force)
            finally:
                lock.release()
        self.poke(RECLAIM_LANE)
        return self.status(workspace_id) or CleanupStatus(
            status="not_needed", reason="no cleanup obligations"
        )

    async def run_cycle(self, lane: str, *, limit: int | None = None) -> CycleResult:
        """One bounded cycle of `lane` (cycle.py)."""
        self.reanchor()
        self.flush_announcements()
        return await self.cycles.run(lane, limit=limit)

    def housekeeping(self) -> None:
        """At service start and now and then: bound future retries (a wall clock that jumped),
        forget old finished rows, and adopt trash entries no obligation names (a crash)."""
        self.reanchor()
        now = self.clock.time()
        self.obligations.clamp_future(now + self.backoff.max_s)
        self.obligations.purge_finished(now - KEEP_COMPLETED_S, now - KEEP_ABANDONED_S)
        self.planner.adopt_orphan_trash(now)

    def reanchor(self) -> float:
        """Move every pending due time by a wall-clock step seen since the last look, so a
        retry keeps the wait it had left; the step (0.0 when none). Called before anything
        reads due times, when the scheduler wakes and when a request runs steps; no await
        between the look and the update, so a step is applied once."""
        delta, moved = self.clock.reanchor(self.obligations.shift_pending)
        if delta:
            log.warning("clock.stepped", delta_s=round(delta, 3), retries_reanchored=moved)
        return delta

    # -- status -----------------------------------------------------------------------------------

    def status(self, workspace_id: str) -> CleanupStatus | None:
        """The latest cleanup status of a workspace (its latest incarnation's obligations)."""
        return status_mod.workspace_status(self.obligations, workspace_id)

    def summary(self) -> CleanupSummary:
        return status_mod.summary(self.obligations)

    def pending_reclaims(self) -> tuple[int, list[Path]]:
        """How many reclaim obligations are pending, and their trash entries (where the trash
        step moved the checkout; one whose trash step has not moved anything has none): what
        disk usage counts as still to be freed."""
        records = self.obligations.pending_ids("reclaim")
        found: list[Path] = []
        for record in records:
            ob = self.obligations.get(record)
            source = self.steps.reclaim_source(ob)[0] if ob is not None else None
            if source is not None:
                found.append(source)
        return len(records), found

    def require_known(self, *, obligation_id: str | None, workspace_id: str | None) -> str:
        """The workspace a retry scope names; unknown ids are errors, never a no-op."""
        return status_mod.require_known(
            self.obligations, obligation_id=obligation_id, workspace_id=workspace_id
        )
