"""Capped exponential backoff with jitter, per obligation."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
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
