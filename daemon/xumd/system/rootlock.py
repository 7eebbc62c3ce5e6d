"""One daemon per root: an exclusive flock on ROOT/xumd.lock (design invariant 7).

The kernel drops a flock when its holder dies, SIGKILL included, so a lock left by a crashed
daemon never blocks a restart. The file's content (pid, start time) is diagnostics only: the lock
is the flock, never the file's existence.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from xumd.system import procstat


class RootLockedError(Exception):
    """Another daemon holds the root."""

    def __init__(self, root: Path, holder: dict[str, Any]) -> None:
        pid = holder.get("pid", "?")
        started = holder.get("started_at")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "?"
        super().__init__(
            f"another xumd (pid {pid}, started {when}) is already running on {root}; "
            f"stop it first (`xum daemon stop --root {root}` or `kill {pid}`)"
        )
        self.holder = holder


@dataclass(slots=True)
class RootLock:
    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1  # pragma: no mutate (any negative value reads as closed)


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        raw = os.pread(fd, 4096, 0)  # pragma: no mutate (the record is about a hundred bytes)
        data = orjson.loads(raw) if raw else {}
        return data if isinstance(data, dict) else {}
    # Not mutated: pread on a descriptor just opened does not fail.
    except (OSError, ValueError):  # pragma: no mutate
        return {}


def acquire(path: Path) -> RootLock:
    """Take the root lock without waiting, or raise RootLockedError naming the holder."""
    # os.open makes the descriptor non-inheritable (PEP 446): children never hold the lock.
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise RootLockedError(path.parent, holder) from None
    except BaseException:
        os.close(fd)
        raise
    info = {"pid": os.getpid(), "process_start_time": own_create_time(), "started_at": time.time()}
    os.ftruncate(fd, 0)  # pragma: no mutate (the longer record written next overwrites it)
    os.pwrite(fd, orjson.dumps(info) + b"\n", 0)
    os.fsync(fd)
    return RootLock(path, fd)


def own_create_time() -> float:
    """This process's start as `psutil.Process().create_time()` gives it (what other readers of
    the lock file compare it with), read without psutil on Linux (`procstat`): psutil's import
    is not on the way to readiness. Elsewhere, psutil's own."""
    created = procstat.kernel_create_time(os.getpid())
    if created is not None:
        return created
    import psutil

    return float(psutil.Process().create_time())
