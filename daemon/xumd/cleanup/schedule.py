"""When cleanup work runs: the two lanes, the backoff after a failure, and the clock (injected,
so scheduling logic is tested with a fake one).

The lanes keep a large reclaim from delaying another workspace's path: `path` is what frees the
checkout's path (teardown, trash); `reclaim` deletes trash entries, which may take minutes. Each
lane runs its own background cycle and takes its own per-workspace lock.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import anyio

PATH_LANE = "path"
RECLAIM_LANE = "reclaim"
LANES: dict[str, tuple[str, ...]] = {
    PATH_LANE: ("teardown", "trash", "prune", "remove_dir"),
    RECLAIM_LANE: ("reclaim",),
}


@dataclass
class Backoff:
    """Capped exponential backoff with jitter, per obligation."""

    initial_s: float
    max_s: float
    jitter: float
    rng: random.Random = field(default_factory=random.Random)

    def base(self, attempts: int) -> float:
        """The un-jittered delay after `attempts` failed attempts (1 -> initial), capped."""
        exponent = min(max(attempts, 1) - 1, 60)  # 2**60 already dwarfs any sane cap
        return min(self.max_s, self.initial_s * (2.0**exponent))

    def delay(self, attempts: int) -> float:
        # Jitter only shortens the delay, so the cap is a hard upper bound and many obligations
        # that failed together (one broken teardown across siblings) spread out.
        return self.base(attempts) * (1.0 - self.jitter * self.rng.random())


class Clock(Protocol):
    def time(self) -> float:
        """Wall time (seconds since the epoch): persisted `next_attempt_at` values use it."""
        ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


STEP_TOLERANCE_S = 1.0
"""A change of (wall - monotonic) larger than this is a step (settimeofday, a VM resumed, NTP's
first sync), not the slow slew of a disciplined clock."""


class StepWatch:
    """Notices wall-clock steps: the offset between the wall and the monotonic clock is constant
    while the wall clock only runs (or slews a little); a step changes it at once."""

    def __init__(self, clock: Clock, tolerance_s: float = STEP_TOLERANCE_S) -> None:
        self.clock = clock
        self.tolerance_s = tolerance_s
        self._offset = clock.time() - clock.monotonic()

    def pending(self, wall: float | None = None) -> float:
        """The step since the last `settle` (0.0 when none), positive when the clock jumped
        ahead; `wall`: the wall time just read, so both readings are one instant's."""
        if wall is None:
            wall = self.clock.time()
        delta = wall - self.clock.monotonic() - self._offset
        return delta if abs(delta) > self.tolerance_s else 0.0

    def settle(self, delta: float) -> None:
        """`delta` is accounted for: the next step is measured from here."""
        self._offset += delta

    def step(self) -> float:
        """The step since the last call (0.0 when none), settled."""
        delta = self.pending()
        self.settle(delta)
        return delta


class ScheduleClock:
    """The cleanup service's clock: wall time on the scale its stored due times are on.

    A stored due time is a wall-clock time, and a step of the wall clock moves every one of
    them by the step at once; they are re-anchored (`reanchor`) when the scheduler wakes. Until
    then this clock subtracts the step: a due time written in between (a request's plan, an
    attempt's backoff) is on the stored times' scale and moves with them, never by the step a
    second time, and a due test never compares a stored time with a stepped clock. With no step
    pending it is the wall clock."""

    def __init__(self, clock: Clock, tolerance_s: float = STEP_TOLERANCE_S) -> None:
        self.inner = clock
        self.watch = StepWatch(clock, tolerance_s)

    def time(self) -> float:
        wall = self.inner.time()
        return wall - self.watch.pending(wall)

    def monotonic(self) -> float:
        return self.inner.monotonic()

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)

    def reanchor(self, shift: Callable[[float], int]) -> tuple[float, int]:
        """Move the stored due times by the step since the last re-anchoring (`shift(delta)`:
        how many moved; it commits or raises, and then the step stays pending): (step, moved).
        Call it outside any transaction, with no await between it and the rows it serves."""
        delta = self.watch.pending()
        if not delta:
            return 0.0, 0
        moved = shift(delta)
        self.watch.settle(delta)
        return delta, moved


class LaneWake:
    """Wakes a lane's background cycle: new work, or a blocker finished. Built with the cleanup
    service, so whatever records an outcome can poke from the start; the retry service arms and
    waits on it. A poke while no cycle waits is dropped: a lane re-arms before each cycle, which
    then reads the store anyway."""

    def __init__(self) -> None:
        self._events: dict[str, anyio.Event] = {}

    def poke(self, lane: str | None = None) -> None:
        for name in [lane] if lane else list(LANES):
            event = self._events.get(name)
            if event is not None:
                event.set()

    def arm(self, lane: str) -> anyio.Event:
        """A fresh event for the lane's next wait (before its cycle reads the store)."""
        event = self._events[lane] = anyio.Event()
        return event
