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
