"""Running one workspace's due steps of a lane, in order, one task at a time.

Steps run in their planned order and stop at the first that is not due, blocked (a sibling's
teardown still owed) or failed: a later step never runs before an earlier one completed. Each
attempt is bounded by `step_timeout_s`, fenced (steps.py), and, when it touches the workspace's
path, held under the directory exclusion.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from xumd.base import logs
from xumd.base.config import CleanupConfig
from xumd.base.errors import XumError
from xumd.base.requestcut import cut_reason
from xumd.checkouts.exclusion import DirectoryExclusion
from xumd.cleanup.obligations import PENDING, ObligationRow, Obligations
from xumd.cleanup.outcomes import OutcomeRecorder
from xumd.cleanup.schedule import LANES, PATH_LANE, Backoff, Clock
from xumd.cleanup.steps import Outcome, Steps

log = logs.get("xumd.cleanup")


class StepRunner:
    def __init__(
        self,
        *,
        obligations: Obligations,
        steps: Steps,
        recorder: OutcomeRecorder,
        directories: DirectoryExclusion,
        backoff: Backoff,
        clock: Clock,
        config: CleanupConfig,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self.obligations = obligations
        self.steps = steps
        self.recorder = recorder
        self.directories = directories
        self.backoff = backoff
        self.clock = clock
        self.config = config
        self.stopping = stopping
        self._locks: dict[str, anyio.Lock] = {}

    def lock(self, workspace_id: str, lane: str) -> anyio.Lock:
        """One task at a time runs a workspace's steps of a lane (a request or the lane's cycle)."""
        key = f"{lane}:{workspace_id}"
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = anyio.Lock()
        return lock

    async def run_steps(self, workspace_id: str, lane: str, *, force: bool) -> bool:
        """Run the workspace's pending steps of `lane` in order; stop at the first that is not
        due, blocked or failed. Returns True if a step was attempted. Call it under `lock`."""
        kinds = LANES[lane]
        attempted = False
        for ob in self.obligations.pending_for_workspace(workspace_id):
            now = self.clock.time()
            if ob.kind not in kinds and lane == PATH_LANE:
                continue  # a reclaim is always its plan's last step: nothing here waits for it
            if ob.kind not in kinds:
                # An earlier step of the other lane is pending (reclaim waits for trash): this
                # lane's later steps are not due before it (the finished step releases them:
                # outcomes.py). Only this lane's: deferring the other lane's steps would make a
                # request running them right now (a remove's teardown, then its trash) stop at
                # a trash it read as not due, and answer pending for nothing.
                self.obligations.defer_later_steps(
                    workspace_id,
                    ob.seq,
                    max(ob.next_attempt_at, now + self.backoff.initial_s),
                    kinds=kinds,
                )
                break
            if not force and ob.next_attempt_at > now:
                self.obligations.defer_later_steps(workspace_id, ob.seq, ob.next_attempt_at)
                # Not mutated: only a trash step can follow, and blocking_teardown holds it back.
                break  # pragma: no mutate
            blocker = self.obligations.blocking_teardown(ob) if ob.kind != "teardown" else None
            if blocker is not None:
                until = max(blocker.next_attempt_at, now + self.backoff.initial_s)
                self.obligations.defer([ob.id], until)
                self.obligations.defer_later_steps(workspace_id, ob.seq, until)
                log.info("cleanup.blocked", obligation=ob.id, by=blocker.id)
                # Not mutated: a blocked step is its lane's last; later ones are deferred.
                break  # pragma: no mutate
            attempted = True
            stored = await self._attempt(ob)
            if stored.state == PENDING:
                self.obligations.defer_later_steps(workspace_id, ob.seq, stored.next_attempt_at)
                # Not mutated: a failed step can only be followed by a held-back trash step.
                break  # pragma: no mutate
        return attempted

    async def _attempt(self, ob: ObligationRow) -> ObligationRow:
        started = time.monotonic()
        try:
            with anyio.fail_after(self.config.step_timeout_s):
                outcome = await self._run_step(ob)
        except anyio.get_cancelled_exc_class():
            # Cut short (the shutdown grace ran out, or the lane was cancelled at a drain): the
            # attempt is recorded as such, due at once, so the answer (and cleanup.list) says
            # why it is pending and the retry service takes it up as soon as the daemon runs
            # again. Recorded without awaiting: the scope is cancelled.
            why = cut_reason(self.stopping())
            self.recorder.record_cut(
                ob,
                f"{ob.kind} was cut short: {why}; it runs again when the daemon next runs "
                "(or on cleanup.retry)",
            )
            raise
        except TimeoutError:
            outcome = Outcome.failed(
                f"{ob.kind} did not finish within {self.config.step_timeout_s}s"
            )
        except XumError as exc:
            outcome = Outcome.failed(exc.message)
        except OSError as exc:
            outcome = Outcome.failed(f"{ob.kind}: {exc}")
        except Exception as exc:
            log.exception("cleanup.step_crashed", obligation=ob.id, kind=ob.kind)
            outcome = Outcome.failed(f"{ob.kind}: internal error: {exc!r}")
        # Not mutated: the duration is only logged.
        return self.recorder.record(ob, outcome, time.monotonic() - started)  # pragma: no mutate

    async def _run_step(self, ob: ObligationRow) -> Outcome:
        if ob.kind == "reclaim":
            # The trash entry is the daemon's own: no workspace path is touched.
            return await self.steps.reclaim(ob)
        async with self.directories.directory(ob.path, label=f"cleanup {ob.kind} {ob.id}"):
            if ob.kind == "teardown":
                return await self.steps.teardown(ob)
            if ob.kind in ("trash", "prune", "remove_dir"):
                return await self.steps.trash(ob)
        return Outcome.abandoned(f"unknown obligation kind {ob.kind!r}")
