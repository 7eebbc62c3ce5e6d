"""Recording what a cleanup step came to: completed, pending again (with backoff), or abandoned
with a reason; then telling others (the obligation event, the workspace's `last_cleanup`, and a
wake-up of the lanes a finished step may unblock).

Obligations planned inside a caller's transaction are announced only once that transaction has
committed (`flush`): a rolled-back plan left no row, and is not announced.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from xum_protocol.models.cleanup import OBLIGATION_EVENT

from xumd.base import logs
from xumd.base.events import EventBus
from xumd.cleanup.obligations import ABANDONED, COMPLETED, PENDING, ObligationRow, Obligations
from xumd.cleanup.schedule import PATH_LANE, RECLAIM_LANE, Backoff, Clock
from xumd.cleanup.status import workspace_status
from xumd.cleanup.steps import Outcome
from xumd.store import Store

log = logs.get("xumd.cleanup")

RememberCleanup = Callable[[str, str], None]
"""Store a workspace's cleanup status (workspace id, `CleanupStatus` as JSON) on its row, inside
the caller's transaction. The row belongs to the lifecycle, a layer above cleanup, so the
composition root hands its writer in."""


class OutcomeRecorder:
    def __init__(
        self,
        store: Store,
        obligations: Obligations,
        events: EventBus,
        backoff: Backoff,
        clock: Clock,
        *,
        poke: Callable[[str], None],
        remember: RememberCleanup,
    ) -> None:
        self.store = store
        self.obligations = obligations
        self.events = events
        self.backoff = backoff
        self.clock = clock
        self._unannounced: list[str] = []
        self.poke = poke
        """Wake a lane (new work, or a blocker finished): the service's `LaneWake`."""
        self.remember = remember

    def record(self, ob: ObligationRow, outcome: Outcome, took_s: float) -> ObligationRow:
        now = self.clock.time()
        if outcome.state == COMPLETED:
            stored = self.obligations.complete(ob, now, outcome.detail)
            log.info("cleanup.completed", obligation=ob.id, kind=ob.kind, s=round(took_s, 3))
            # A finished teardown may unblock a sibling's deletion; a trash, its reclaim.
            self._release_and_poke(stored, now)
        elif outcome.state == ABANDONED:
            stored = self.obligations.abandon(ob, now, outcome.reason or "abandoned")
            log.warning("cleanup.abandoned", obligation=ob.id, kind=ob.kind, reason=stored.reason)
            self._release_and_poke(stored, now)
        else:
            delay = self.backoff.delay(ob.attempts + 1)
            stored = self.obligations.fail_attempt(ob, now, now + delay, outcome.error or "failed")
            log.warning(
                "cleanup.attempt_failed",
                obligation=ob.id,
                kind=ob.kind,
                attempts=stored.attempts,
                retry_in_s=round(delay, 3),
            )
        self._announce(stored)
        self._remember_status(ob.workspace_id)
        return stored

    def record_cut(self, ob: ObligationRow, error: str) -> None:
        """An attempt cut short by a cancellation: pending, due at once, saying why; not
        counted as a failed attempt (it was interrupted, and must not lengthen the backoff).
        Called from a cancelled scope, so nothing here awaits."""
        now = self.clock.time()
        current = self.obligations.get(ob.id)
        if current is None or current.state != PENDING:
            return  # the step recorded its own outcome before the cut
        stored = self.obligations.cut_short(current, now, error)
        log.warning("cleanup.attempt_cut_short", obligation=ob.id, kind=ob.kind)
        self._announce(stored)
        self._remember_status(ob.workspace_id)

    def _release_and_poke(self, stored: ObligationRow, now: float) -> None:
        """Make what waited for this step due now, then wake the lanes. A lane that looked while
        this step was owed (the reclaim lane, woken by the remove's registry event while the
        trash step ran) deferred the later steps by `backoff_initial_s`: a poke alone would find
        them not due and sleep that long again. Only when the step really finished (a row that
        another task settled meanwhile is left as it is); one release per finished step, so
        the lanes still never spin."""
        if stored.state != PENDING:
            self.obligations.release_later_steps(stored.workspace_id, stored.seq, now)
            if stored.kind == "teardown":
                # A sibling workspace's deletion of the same directory waited for this one.
                self.obligations.release_blocked_siblings(stored, now)
        self.poke(PATH_LANE)
        self.poke(RECLAIM_LANE)

    def announce_later(self, ids: Iterable[str]) -> None:
        """Obligations planned in a transaction not committed yet: announced by `flush`."""
        self._unannounced.extend(ids)

    def flush(self) -> None:
        """Publish the creation of obligations planned in a transaction that has committed (a
        rolled-back plan left no row, and is not announced)."""
        ids, self._unannounced = self._unannounced, []
        for ob_id in ids:
            ob = self.obligations.get(ob_id)
            if ob is not None:
                self._announce(ob)

    def _announce(self, ob: ObligationRow) -> None:
        self.events.publish(OBLIGATION_EVENT, obligation=ob.model().model_dump(mode="json"))

    def _remember_status(self, workspace_id: str) -> None:
        """Keep `workspaces.last_cleanup` current for workspace.get (the row, if any). Not a
        structural change: the row's version is not bumped."""
        status = workspace_status(self.obligations, workspace_id) if workspace_id else None
        if status is None:
            return
        with self.store.transaction():
            self.remember(workspace_id, json.dumps(status.model_dump(mode="json")))
