"""Who a process is: its pid *and* its start time, stable across wall-clock steps; and whether
that process (not a reuse of its pid) still runs.

The start comes from the platform backend as seconds since boot (Linux: /proc/PID/stat's ticks;
portable: psutil's create_time less the boot time); it is stored as that plus a boot anchor.
procutil, containment and the probes ask here.
"""

from __future__ import annotations

import time
from pathlib import Path

from xumd.base import logs
from xumd.system import atomicfile
from xumd.system.platform import current

log = logs.get("xumd.proc")

# A process is identified by what a wall-clock step cannot change: its start time since boot,
# within one boot (the kernel's boot id). psutil's create_time adds the kernel's *current* idea
# of the boot's wall-clock time, which moves with every step of the wall clock: after a one-hour
# step across a restart, every recorded holder looked dead (pid reuse) and its lease was
# dropped. The stored form stays a wall-clock-like float (older records and the protocol keep
# their meaning): the start since boot is added to a boot anchor fixed once per boot and kept
# under the root (`anchor_boot`), not re-read from the kernel.

_boot_anchor: float | None = None


def anchor_boot(path: Path) -> float:
    """Fix the boot anchor for this boot: read it from `path` when it was written in this boot
    (same boot id), else take the kernel's boot time now and write it (atomically). Called at
    start-up under the root lock; without it the anchor is the kernel's at first use."""
    global _boot_anchor
    backend = current()
    backend.since_boot()  # its time namespace offset read now, while descriptors are plenty
    booted = backend.boot_id()
    try:
        with open(path, encoding="utf-8") as handle:
            stored = handle.read().split()
        if booted is not None and len(stored) == 2 and stored[0] == booted:
            _boot_anchor = float(stored[1])
            return _boot_anchor
    except (OSError, ValueError):
        pass
    _boot_anchor = backend.kernel_boot_time()
    if booted is not None:
        try:
            # Not durable: the anchor is only of use within this boot, and a power loss ends it.
            atomicfile.write_atomic(
                path,
                f"{booted} {_boot_anchor!r}\n".encode(),
                durable=False,
                mode=0o666,
                temp_name=path.name + ".tmp",
            )
        except OSError as exc:
            # Identities still hold within this daemon's life; log it, never fail the start.
            log.warning("proc.boot_anchor_unsaved", path=str(path), error=exc.strerror)
    log.info("proc.boot_anchored", boot_id=booted, anchor=_boot_anchor)
    return _boot_anchor


def _anchor() -> float:
    global _boot_anchor
    if _boot_anchor is None:
        _boot_anchor = current().kernel_boot_time()
    return _boot_anchor


def anchored_now() -> float:
    """Now, on the clock process start times are read on: the boot anchor plus the time since
    boot (suspend included: CLOCK_BOOTTIME). Within one boot it runs with real time whatever the
    wall clock does; a wall-clock step moves `time.time()`, never this. Where there is no boot
    clock (the portable backend) it is the wall clock: no protection, and no false one."""
    since = current().since_boot()
    if since is None:
        return time.time()
    return _anchor() + since


def identity(pid: int, *, strict: bool = False) -> tuple[float, bool] | None:
    """(start time, zombie) of pid, or None when there is no such process. The start time is
    the boot anchor plus the start since boot: stable across wall-clock steps. Out of
    descriptors or memory raises; with `strict`, so does any other failed read, for a caller
    that must never take "could not read" for "gone"."""
    if pid <= 0:
        return None
    found = current().start_since_boot(pid, strict=strict)
    if found is None:
        return None
    since, zombie = found
    return round(_anchor() + since, 3), zombie


def kernel_create_time(pid: int) -> float | None:
    """The process's start as `psutil.Process(pid).create_time()` gives it: its start since
    boot plus the kernel's boot time now (it moves with wall-clock steps, unlike `identity`'s
    anchor). For records other tools compare with psutil's (the root lock's holder). None when
    there is no such process."""
    return current().kernel_create_time(pid)


def tree_identities(root: int) -> dict[int, float | None]:
    """root and every descendant, each with its start time (see `identity`), from one scan in
    which a process's parent and its start time come from the same read (Linux): a member that
    ends between the scan and a later read, its pid handed to a stranger, can never lend that
    stranger its place in the tree. Empty when root is gone."""
    if root <= 0:
        return {}
    anchor = _anchor()
    return {
        pid: None if since is None else round(anchor + since, 3)
        for pid, since in current().tree_since_boot(root).items()
    }


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
