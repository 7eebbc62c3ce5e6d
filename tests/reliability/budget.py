"""Sizes of the reliability suite: full under `make test-reliability`, a bounded sample in CI.

`XUM_RELIABILITY_SAMPLE=1` (set by `make test-reliability-sample`) shrinks every size and
duration so the whole sample stays within about three minutes on two shared cores.
"""

from __future__ import annotations

import os

SAMPLE = os.environ.get("XUM_RELIABILITY_SAMPLE") == "1"


def size(full: int, sample: int) -> int:
    return sample if SAMPLE else full


def seconds(full: float, sample: float) -> float:
    return sample if SAMPLE else full
