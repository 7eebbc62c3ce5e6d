"""File descriptors: raise the soft limit at start, cap connections below it, keep a reserve.

A daemon that runs out of descriptors cannot accept, spawn git, open the store or a PTY. The
rules, in the order they act:

1. At start the soft `RLIMIT_NOFILE` is raised to the hard limit (bounded by `TARGET_MAX`, so a
   child that loops over every possible descriptor is not slowed by a huge limit). Only the
   daemon's: every child starts with the soft limit the daemon started with (`child_soft`),
   as systemd passes the limit it was started with to what it forks while raising its own
   (a program that `select()`s cannot watch a descriptor from 1024 on, and one that sizes a
   table per possible descriptor pays for every one). The rule is "what the environment gave",
   not a fixed 1024: a user's `ulimit -n 4096` or a unit's `LimitNOFILE=` is what they chose
   for the programs they run. The shims do it in the child (`containment.shim_prologue`),
   procutil with util-linux's `prlimit` before the command runs.
2. Client connections are capped below the soft limit: `reserve` descriptors stay for the
   daemon's own work (git pipes, scripts, the store, the supervisor's PTYs). The newest client
   over the cap gets one clear `busy` error and is closed.
3. One spare descriptor is held open. When `accept` fails with EMFILE/ENFILE anyway (something
   else used the reserve), the spare is given up for a moment so the newest client can be
   accepted, told why, and closed; the listener backs off and logs once per episode instead of
   crashing or spinning on the readable backlog.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from xumd.base import logs
from xumd.system.platform import common, current

log = logs.get("xumd.system.fdlimits")

TARGET_MAX = 1 << 20
"""Never raise the soft limit beyond this (hard limits of 2^30 exist in containers)."""

FD_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
# "Out of descriptors or kernel memory": the platform's one "could not look" set.
EXHAUSTED = common.EXHAUSTED
is_exhausted = common.is_exhausted


@dataclass
class FdLimits:
    initial_soft: int
    soft: int
    hard: int
    max_connections: int
    reserve: int
    refused: int = 0
    accept_failures: int = 0
    _spare: int | None = field(default=None, repr=False)

    def as_status(self) -> dict[str, int]:
        return {
            "soft": self.soft,
            "hard": self.hard,
            "initial_soft": self.initial_soft,
            "max_connections": self.max_connections,
            "reserve": self.reserve,
            "open": _recent_open_count(),
            "refused_connections": self.refused,
            "accept_failures": self.accept_failures,
        }

    # -- the spare descriptor ----------------------------------------------------------------

    def hold_spare(self) -> None:
        if self._spare is None:
            try:
                self._spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                # Retried after the next successful accept; nothing else depends on it.
                log.warning("fd.spare_unavailable", error=exc.strerror)

    @contextlib.contextmanager
    def spare_released(self) -> Iterator[None]:
        """Give the spare descriptor up for the duration of the block, then take it back."""
        if self._spare is not None:
            with contextlib.suppress(OSError):
                os.close(self._spare)
            self._spare = None
        try:
            yield
        finally:
            self.hold_spare()

    def close(self) -> None:
        if self._spare is not None:
            with contextlib.suppress(OSError):
                os.close(self._spare)
            self._spare = None


OPEN_COUNT_TTL_S = 0.5
"""`daemon.status` reports the open count sampled at most this often: listing /proc/self/fd was
the largest single cost of a status poll, and monitors poll many times a second."""
_open_sample: tuple[float, int] = (float("-inf"), 0)


def _recent_open_count() -> int:
    global _open_sample
    now = time.monotonic()
    taken, count = _open_sample
    if now - taken >= OPEN_COUNT_TTL_S:
        count = open_count()
        _open_sample = (now, count)
    return count


def open_count() -> int:
    return current().open_fd_count()


_child_soft: int | None = None


def child_soft() -> int | None:
    """The soft RLIMIT_NOFILE a child must start with: the one the daemon started with, once
    the daemon raised its own above it; None while the daemon changed nothing (a child then
    inherits the limit as it is, which is that one)."""
    return _child_soft


def raise_soft_limit() -> tuple[int, int, int]:
    """(initial soft, soft now, hard). Raising never fails the start: a refused raise is logged
    and the daemon lives within the limit it has (the connection cap follows it)."""
    global _child_soft
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    initial = soft
    target = hard if hard != resource.RLIM_INFINITY else TARGET_MAX
    target = min(target, TARGET_MAX)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
            _child_soft = initial
        except (OSError, ValueError) as exc:
            log.warning("fd.limit_raise_failed", soft=soft, hard=hard, error=str(exc))
    if soft == resource.RLIM_INFINITY:
        soft = TARGET_MAX
    if hard == resource.RLIM_INFINITY:
        hard = TARGET_MAX
    return initial, soft, hard


def plan(max_connections: int, fd_reserve: int) -> FdLimits:
    """Raise the limit, then size the connection cap below it."""
    initial, soft, hard = raise_soft_limit()
    # A tiny limit (a test's prlimit, a hostile environment) still leaves half for our work.
    reserve = min(fd_reserve, soft // 2)
    cap = max(1, min(max_connections, soft - reserve))
    limits = FdLimits(
        initial_soft=initial, soft=soft, hard=hard, max_connections=cap, reserve=reserve
    )
    limits.hold_spare()
    log.info(
        "fd.limits",
        initial_soft=initial,
        soft=soft,
        hard=hard,
        max_connections=cap,
        reserve=reserve,
    )
    return limits
