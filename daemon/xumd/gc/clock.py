"""The clock gc ages records by: the system's wall clock plus an offset that only a test method
(`test.clock_advance`, with `enable_test_methods`) moves, so tests age records without sleeping
and without editing the store under a live daemon."""

from __future__ import annotations

import time


class GcClock:
    def __init__(self) -> None:
        self.offset_s = 0.0

    def time(self) -> float:
        return time.time() + self.offset_s

    def advance(self, seconds: float) -> float:
        self.offset_s += seconds
        return self.time()
