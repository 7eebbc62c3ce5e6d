"""The cleanup-retry service: completes pending obligations on its own, in the background.

- Started after readiness (`app.after_ready`): a daemon with 10,000 pending obligations is ready
  as fast as one with none; discovery is the store itself, read in bounded batches.
- Wakes at start, after every registry change (`workspace.*`, `project.*` events), when a
  step it depends on finishes (`poke`), and on a timer (poll_interval_s or the next due time).
- A wall-clock step moves the stored due times when a lane wakes (`service.reanchor`): the
  lanes wait on the monotonic clock, and a retry keeps the wait it had left.
- Never spins: a cycle that attempted nothing waits at least `backoff_initial_s`; failures are
  pushed out by the per-obligation capped backoff.
- Shutdown cancels the lanes and awaits them (bounded by the drain deadline); a teardown child is
  tree-killed by procutil.run_command on cancellation; its obligation stays pending.
"""

from __future__ import annotations

import anyio
from xum_protocol.models.events import Event

from xumd.base import faults, logs
from xumd.cleanup.schedule import Clock
from xumd.cleanup.service import LANES, CleanupService, CycleResult

log = logs.get("xumd.cleanup.retry")

REGISTRY_EVENTS = ("workspace.", "project.")

START_HOLD = faults.declare(
    "cleanup.retry.hold_start",
    "simulate: hold the retry service before its first look at the store, until the test "
    "releases it (faults.FaultPoint.hold): readiness is shown not to wait for it",
    simulate=True,
)


class RetryService:
    def __init__(self, service: CleanupService, clock: Clock | None = None) -> None:
        self.service = service
        self.clock = clock or service.clock
        self.config = service.config
        self._scope: anyio.CancelScope | None = None
        self._done: anyio.Event | None = None
        self.cycles = 0

    def poke(self, lane: str | None = None) -> None:
        self.service.poke(lane)

    def _on_event(self, event: Event) -> None:
        # Registry changes only: our own obligation events would wake us for work we just did,
        # and chatty events (process output) must not turn into a query each.
        if event.type.startswith(REGISTRY_EVENTS):
            self.poke()

    async def run(self) -> None:
        self._done = anyio.Event()
        await START_HOLD.hold()
        unlisten = self.service.app.events.listen(self._on_event)
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                self.service.housekeeping()
                async with anyio.create_task_group() as lanes:
                    for lane in LANES:
                        lanes.start_soon(self._lane, lane)
        finally:
            unlisten()
            self._done.set()
            log.info("cleanup.retry_stopped", cycles=self.cycles)

    async def stop(self) -> None:
        """Cancel the lanes and wait for them (the caller bounds this with its deadline)."""
        if self._scope is not None:
            self._scope.cancel()
        if self._done is not None:
            await self._done.wait()

    async def _lane(self, lane: str) -> None:
        housekeeping_at = self.clock.monotonic() + 3600.0
        while True:
            wake = self.service.wake.arm(lane)
            try:
                result = await self.service.run_cycle(lane)
            except Exception:
                # A broken cycle (a store error) must not end the service: retry after a pause.
                log.exception("cleanup.cycle_failed", lane=lane)
                result = CycleResult(next_due=None)
            self.cycles += 1
            delay = self.next_delay(result)
            if delay > 0:
                await self._wait(wake, delay)
            else:
                await anyio.lowlevel.checkpoint()
            if lane == "path" and self.clock.monotonic() > housekeeping_at:
                housekeeping_at = self.clock.monotonic() + 3600.0
                self.service.housekeeping()

    def next_delay(self, result: CycleResult) -> float:
        """How long a lane sleeps after a cycle (a wake-up ends the sleep early)."""
        if result.full and result.attempted:
            return 0.0  # more is due right now: the next batch, after a checkpoint
        poll = self.config.poll_interval_s
        if result.next_due is None:
            return poll
        # The service's clock: on the scale of the due time the cycle read (a wall-clock step
        # since is subtracted until the next cycle re-anchors the stored times).
        delay = min(poll, max(0.0, result.next_due - self.service.clock.time()))
        if not result.attempted:
            # Nothing ran although something is due (blocked, or running elsewhere): the
            # finisher pokes us; until then never spin.
            delay = max(delay, self.config.backoff_initial_s)
        return delay

    async def _wait(self, wake: anyio.Event, delay: float) -> None:
        if wake.is_set():
            return
        async with anyio.create_task_group() as tg:

            async def sleeper() -> None:
                await self.clock.sleep(delay)
                tg.cancel_scope.cancel()

            async def waiter() -> None:
                await wake.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(sleeper)
            tg.start_soon(waiter)
