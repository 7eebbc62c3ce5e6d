"""Time, injected: scheduling logic (backoff, fairness, wake-ups) is tested with a fake clock."""

from __future__ import annotations

import time
from typing import Protocol

import anyio


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

    def step(self) -> float:
        """The step since the last call (0.0 when none): positive when the clock jumped ahead."""
        offset = self.clock.time() - self.clock.monotonic()
        delta = offset - self._offset
        if abs(delta) <= self.tolerance_s:
            return 0.0
        self._offset = offset
        return delta
