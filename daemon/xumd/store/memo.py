"""A value derived from the store, recomputed only when the store changed.

`daemon.status` is what monitors poll; its details (cleanup summary, interrupted count, lease
count) are SQL queries whose answers change only when a row does. `StoreMemo` keeps the last
answer while `Store.changes` stays put, so a poll costs one integer comparison. A row change
makes the next call recompute (never stale after a change); `max_age_s` bounds the age anyway,
for anything the value depends on outside the store (and SQLite's rare uncounted writes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

from xumd.store.db import Store

T = TypeVar("T")

MAX_AGE_S = 1.0


class StoreMemo(Generic[T]):
    def __init__(
        self,
        store: Store,
        compute: Callable[[], T],
        *,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._compute = compute
        self._max_age_s = max_age_s
        self._clock = clock
        self._changes = -1
        self._at = 0.0
        # A flag, not `value is None`: a value that is None is memoized like any other.
        self._computed = False
        self._value: T | None = None

    def __call__(self) -> T:
        changes = self._store.changes
        now = self._clock()
        if not self._computed or changes != self._changes or now - self._at >= self._max_age_s:
            self._value = self._compute()
            self._computed = True
            # Read after computing: a compute that writes (it should not) is not memoized stale.
            self._changes = self._store.changes
            self._at = now
        return self._value  # type: ignore[return-value]  # T itself once computed
