"""The root's bytes as a create (and the warm pool's refill) sees them against `[gc] max_bytes`:
a cheap figure, honest about what it can miss.

Measuring the root (every checkout, the trash, the archive store, the pool's entries: the usage
walk) costs a walk of everything, too dear for every create. gc measures it anyway at each of
its budget checks (every `budget_interval_s`, after each create, in `gc.plan`); each such
measurement is recorded here, and the figure between two of them is

    measured + reserved + unexplained

- `measured`: the walk's total (`workspace.usage`'s `root.total_bytes`).
- `reserved`: each create's estimate (the base's tree plus `[create] copy`), reserved when the
  create passed the check, in the same synchronous step (two creates cannot both take the last
  room); an unarchive reserves its checkout the same way. A reservation is dropped by the first
  measurement that began after its create ended: kept while its row is `creating` (or
  `restoring`), or was when that walk began (the walk may have seen the
  checkout half written). A create with no row yet (between its check and its intent row, a
  synchronous step, unless a test holds it there) keeps it through one measurement; a failed
  create's row is gone, so its reservation goes at the second.
- `unexplained`: what the filesystems the root spans grew by since the walk began (their used
  blocks, one `statvfs` each), beyond the reservations. This is what agents, builds and the
  refill wrote inside the root meanwhile. It can also count writes outside the root on the same
  filesystem, which only makes the figure higher.

The figure is too low only when something inside the root grew while something else on the same
filesystem shrank by as much, within one interval. It is never older than the walk it starts
from: past `2 * budget_interval_s` (a check that failed or was late) it is unknown, and the
create has gc measure first. A figure that says a create would cross `max_bytes` is never
trusted for a refusal: gc measures again (every checkout walked anew) and collects what the
policy allows first (lifecycle/capacity.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from xumd.lifecycle import rows
from xumd.store import Store

MAKING = ("creating", "restoring")
"""The states of a workspace whose checkout is being written (its reservation is kept)."""


@dataclass(frozen=True, slots=True)
class Mark:
    """Taken when a walk begins, handed back with its total."""

    seq: int
    at: float
    used: dict[str, int]
    creating: frozenset[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Figure:
    total: int
    measured: int
    reserved: int
    unexplained: int
    age_s: float

    def describe(self) -> str:
        parts = [f"{self.measured} bytes measured {self.age_s:.0f} s ago"]
        if self.reserved:
            parts.append(f"{self.reserved} reserved by creates since")
        if self.unexplained:
            parts.append(f"{self.unexplained} the filesystems grew by since")
        return " + ".join(parts)


@dataclass(slots=True)
class _Reserved:
    seq: int
    key: tuple[str, str]
    bytes: int
    rowless: int = 0
    """Measurements this reservation outlived with no row of its create."""


def _used(mount: str) -> int | None:
    try:
        vfs = os.statvfs(mount)
    except OSError:
        return None
    return (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize


class RootBytes:
    def __init__(
        self, store: Store, *, walked: bool, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.walked = walked
        """Whether gc walks the root (`max_bytes` set): reservations then wait for a walk;
        without, only those still being made are kept (`in_flight`)."""
        self.clock = clock
        self._seq = 0
        self._reserved: list[_Reserved] = []
        self._base: tuple[Mark, int] | None = None
        self.measurements = 0
        """How many walks were recorded (a caller tells a fresh figure from the one it had)."""

    def _creating(self) -> frozenset[tuple[str, str]]:
        """The workspaces being made: created, or given their checkout back (unarchive)."""
        found = [r for state in MAKING for r in rows.list_workspaces(self.store, None, state)]
        return frozenset((r.project_id, r.name) for r in found)

    def begin(self, mounts: Iterable[str]) -> Mark:
        """When a walk of the root begins (synchronously, before its first await)."""
        used = {m: u for m in mounts if (u := _used(m)) is not None}
        return Mark(self._seq, self.clock(), used, self._creating())

    def record(self, mark: Mark, total: int) -> None:
        """The walk that began at `mark` found `total` bytes."""
        creating = self._creating() | mark.creating
        kept: list[_Reserved] = []
        known: frozenset[tuple[str, str]] | None = None
        for r in self._reserved:
            if r.seq > mark.seq or r.key in creating:
                kept.append(r)
                continue
            if known is None:
                known = frozenset((w.project_id, w.name) for w in rows.list_workspaces(self.store))
            if r.key not in known and not r.rowless:
                r.rowless += 1
                kept.append(r)
        self._reserved = kept
        self._base = (mark, total)
        self.measurements += 1

    def reserve(self, project_id: str, name: str, size: int) -> None:
        """A create that passed the check will write about `size` bytes (call it in the step
        that checked, before any await)."""
        if size <= 0:
            return
        if not self.walked:
            creating = self._creating()
            self._reserved = [r for r in self._reserved if r.key in creating]
        self._seq += 1
        self._reserved.append(_Reserved(self._seq, (project_id, name), size))

    def in_flight(self) -> int:
        """The bytes reserved by creates still being made (their rows `creating`): space the
        filesystem does not show as used yet (the warm pool's refill leaves it to them)."""
        creating = self._creating()
        return sum(r.bytes for r in self._reserved if r.key in creating)

    def figure(self, max_age_s: float) -> Figure | None:
        """The root's bytes now as estimated above, or None when no walk was recorded within
        `max_age_s`."""
        if self._base is None:
            return None
        mark, measured = self._base
        age = self.clock() - mark.at
        if age > max_age_s:
            return None
        reserved = sum(r.bytes for r in self._reserved)
        grown = 0
        for mount, then in mark.used.items():
            now = _used(mount)
            if now is not None:
                grown += max(0, now - then)
        unexplained = max(0, grown - reserved)
        return Figure(measured + reserved + unexplained, measured, reserved, unexplained, age)
