"""Who a process is: its pid *and* its start time, read from /proc, stable across wall-clock
steps; and whether that process (not a reuse of its pid) still runs.

The one reader of /proc/PID/stat (`stat_fields`): procutil, containment and the probes ask
here.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

from xumd.base import logs
from xumd.system import atomicfile
from xumd.system.fdlimits import is_exhausted

log = logs.get("xumd.proc")

# A process is identified by what a wall-clock step cannot change: its start time in clock ticks
# since boot (/proc/PID/stat field 22), within one boot (the kernel's boot id). psutil's
# create_time adds the kernel's *current* idea of the boot's wall-clock time, which moves with
# every step of the wall clock: after a one-hour step across a restart, every recorded holder
# looked dead (pid reuse) and its lease was dropped. The stored form stays a wall-clock-like
# float (older records and the protocol keep their meaning): ticks are added to a boot anchor
# fixed once per boot and kept under the root (`anchor_boot`), not re-read from the kernel.

# Not mutated: the fallback is Linux's USER_HZ, never taken on POSIX.
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # pragma: no mutate
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
_boot_anchor: float | None = None


def boot_id() -> str | None:
    try:
        with open(_BOOT_ID, encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def _kernel_boot_time() -> float:
    """The boot's wall-clock time as the kernel computes it now (moves with clock steps):
    /proc/stat's `btime`, what `psutil.boot_time()` reads on Linux (psutil is not imported on
    the way to readiness); psutil's elsewhere."""
    try:
        with open("/proc/stat", "rb") as handle:
            for line in handle:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    import psutil

    return float(psutil.boot_time())


@functools.cache
def _timens_boottime_offset() -> float:
    """This process's time namespace boottime offset: /proc/PID/stat start times are shown
    shifted by it, so a daemon restarted in another time namespace normalises them back.
    A process never changes its time namespace: read once (also never under EMFILE later)."""
    try:
        with open("/proc/self/timens_offsets", encoding="ascii") as handle:
            for line in handle:
                name, secs, nanos = line.split()
                if name == "boottime":
                    return int(secs) + int(nanos) / 1e9
    except (OSError, ValueError):
        pass
    return 0.0


def anchor_boot(path: Path) -> float:
    """Fix the boot anchor for this boot: read it from `path` when it was written in this boot
    (same boot id), else take the kernel's boot time now and write it (atomically). Called at
    start-up under the root lock; without it the anchor is the kernel's at first use."""
    global _boot_anchor
    _timens_boottime_offset()  # read now, at start, while descriptors are plenty
    current = boot_id()
    try:
        with open(path, encoding="utf-8") as handle:
            stored = handle.read().split()
        if current is not None and len(stored) == 2 and stored[0] == current:
            _boot_anchor = float(stored[1])
            return _boot_anchor
    except (OSError, ValueError):
        pass
    _boot_anchor = _kernel_boot_time()
    if current is not None:
        try:
            # Not durable: the anchor is only of use within this boot, and a power loss ends it.
            atomicfile.write_atomic(
                path,
                f"{current} {_boot_anchor!r}\n".encode(),
                durable=False,
                mode=0o666,
                temp_name=path.name + ".tmp",
            )
        except OSError as exc:
            # Identities still hold within this daemon's life; log it, never fail the start.
            log.warning("proc.boot_anchor_unsaved", path=str(path), error=exc.strerror)
    log.info("proc.boot_anchored", boot_id=current, anchor=_boot_anchor)
    return _boot_anchor


def _anchor() -> float:
    global _boot_anchor
    if _boot_anchor is None:
        _boot_anchor = _kernel_boot_time()
    return _boot_anchor


def anchored_now() -> float:
    """Now, on the clock process start times are read on: the boot anchor plus the time since
    boot (suspend included: CLOCK_BOOTTIME). Within one boot it runs with real time whatever the
    wall clock does; a wall-clock step moves `time.time()`, never this. Where there is no boot
    clock (not Linux) it is the wall clock: no protection, and no false one."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        return time.time()
    return _anchor() + time.clock_gettime(boottime) - _timens_boottime_offset()


def stat_fields(pid: int, *, strict: bool = False) -> list[str] | None:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses): field 0
    is the state letter. None when there is no such process. Out of descriptors or memory
    raises (`fdlimits.is_exhausted`); with `strict`, so does any other failed read, for a
    caller that must never take "could not read" for "gone"."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as exc:
        if strict or is_exhausted(exc):
            # Could not look is not "no such process": a holder judged dead for want of a
            # descriptor would lose its lease (fail closed: the caller answers or retries).
            raise
        return None
    return raw[raw.rfind(b")") + 2 :].decode("ascii", "replace").split()


def identity(pid: int, *, strict: bool = False) -> tuple[float, bool] | None:
    """(start time, zombie) of pid, or None when there is no such process. The start time is
    the boot anchor plus the start in ticks since boot: stable across wall-clock steps.
    `strict`: as `stat_fields`."""
    if pid <= 0:
        return None
    fields = stat_fields(pid, strict=strict)
    if fields is None or len(fields) < 20:
        if sys.platform.startswith("linux"):
            return None
        import psutil

        try:  # elsewhere: psutil's create_time, the best there is
            proc = psutil.Process(pid)
            return proc.create_time(), proc.status() == psutil.STATUS_ZOMBIE
        except (psutil.Error, ValueError):
            return None
    return _ticks_to_start(fields[19]), fields[0] in ("Z", "X")


def kernel_create_time(pid: int) -> float | None:
    """The process's start as `psutil.Process(pid).create_time()` gives it on Linux: its start
    in ticks after boot plus the kernel's boot time now (`btime`: it moves with wall-clock
    steps, unlike `identity`'s anchor). For records other tools compare with psutil's (the root
    lock's holder). None when there is no such process, or elsewhere than Linux."""
    fields = stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return int(fields[19]) / _CLK_TCK + _kernel_boot_time()


def _ticks_to_start(ticks_field: str) -> float:
    ticks = int(ticks_field) / _CLK_TCK - _timens_boottime_offset()
    return round(_anchor() + ticks, 3)


def tree_identities(root: int) -> dict[int, float | None]:
    """root and every descendant, each with its start time (see `identity`), from one scan in
    which a process's parent and its start time come from the same read of its stat: a
    member that ends between the scan and a later read, its pid handed to a stranger, can
    never lend that stranger its place in the tree. Empty when root is gone."""
    if root <= 0:
        return {}
    if not sys.platform.startswith("linux"):
        return _tree_from_psutil(root)
    parents: dict[int, list[int]] = {}
    starts: dict[int, float | None] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return _tree_from_psutil(root)
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        fields = stat_fields(pid)
        if fields is None or len(fields) < 20:
            continue
        parents.setdefault(int(fields[1]), []).append(pid)
        starts[pid] = _ticks_to_start(fields[19])
    if root not in starts:
        return {}
    found: dict[int, float | None] = {}
    pending = [root]
    while pending:
        pid = pending.pop()
        if pid in found:  # a pid reused mid-scan could close a loop
            continue
        found[pid] = starts[pid]
        pending.extend(parents.get(pid, ()))
    return found


def _tree_from_psutil(root: int) -> dict[int, float | None]:
    import psutil

    try:
        pids = [root, *(c.pid for c in psutil.Process(root).children(recursive=True))]
    except psutil.Error:
        return {}
    return {pid: start_time(pid) for pid in pids}


def start_time(pid: int, *, strict: bool = False) -> float | None:
    """The process's start time (see `identity`), or None when there is no such process."""
    found = identity(pid, strict=strict)
    return found[0] if found is not None else None


START_TOLERANCE_S = 0.05
"""Start times are exact to a clock tick (10 ms); records from psutil's create_time (before the
boot anchor) were rounded differently: allow that, never a reused pid's different start."""


def same_process_alive(pid: int, recorded_start: float | None) -> bool:
    """True while the process with this pid *and* this start time runs: pid reuse is not life."""
    found = identity(pid)
    if found is None:
        return False
    started, zombie = found
    if zombie:
        return False
    return recorded_start is None or abs(started - recorded_start) < START_TOLERANCE_S
