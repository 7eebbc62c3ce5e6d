"""Liveness and usage probes: is a holder still alive, and who else uses a checkout?

Liveness rule (pid reuse is not liveness): a holder recorded as (pid, start time, pgid) is alive
while the process with that pid *and* that start time runs. When the pid is gone, it is still alive
while any process of its recorded group runs: Linux never hands out a pid that is in use as a
process-group id, so a group that still has members is the holder's own group. When the pid now
belongs to a process with another start time, the pid was reused, which the kernel only does once
the old group is empty: dead.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from xumd.system.platform import current
from xumd.system.procstat import START_TOLERANCE_S, identity, same_process_alive


def group_members(pgid: int, *, exclude_zombies: bool = True) -> list[int]:
    """Pids of the live members of process group `pgid` (kill(-pgid, 0) first: cheap ESRCH)."""
    if pgid <= 1:
        return []
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    import psutil  # at first use: an idle daemon never loads it (docs/PERFORMANCE.md)

    members: list[int] = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) != pgid:
                continue
        except OSError:
            continue
        if exclude_zombies and proc.info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        members.append(proc.pid)
    return members


def holder_alive(pid: int | None, start_time: float | None, pgid: int | None) -> bool:
    """The liveness rule above. A holder with no pid yet is judged by the caller."""
    if pid is None or pid <= 0:
        return False
    # procstat.identity: a start time that a wall-clock step does not move.
    status = identity(pid)
    if status is not None:
        started, zombie = status
        same = start_time is None or abs(started - start_time) < START_TOLERANCE_S
        if not same:
            return False  # reused pid: the old group is necessarily empty
        if not zombie:
            return True
    return bool(pgid and group_members(pgid))


def owner_alive(pid: int, start_time: float | None) -> bool:
    return same_process_alive(pid, start_time)


@dataclass(frozen=True, slots=True)
class Usage:
    pid: int
    name: str
    since: float
    where: str  # "cwd" or "open file"
    argv: list[str] = field(default_factory=list)
    """Its command line, when readable (a holder is named by it)."""


def find_users(
    checkout: Path, *, exclude_pids: set[int], exclude_pgids: set[int], limit: int = 64
) -> list[Usage]:
    """Processes whose cwd or an open file (a regular file) lies inside `checkout`, whatever
    their user: a process of another user inside is still a holder that a delete would harm. A
    process whose /proc links this daemon may not read (another user's, unless the daemon is
    root) cannot be seen at all; it is skipped, not an error (docs/RELIABILITY.md).

    Blocking (it reads /proc of every process): run it in a worker thread under a deadline.
    The daemon's own children are not excused: a structural change holds the workspace's
    exclusive reservation, so none of its own work runs there, and failing closed is safer.
    """
    try:
        root = os.path.realpath(checkout)
    except OSError:
        return []
    users = current().users_under(root, exclude_pids, exclude_pgids, limit)
    return [Usage(*user) for user in users]


async def leader_gone(pid: int, start: float | None, *, recheck_s: float = 1.0) -> None:
    """Return once the process (pid *and* start time) has ended. A pidfd becomes readable when
    any process ends, not only a child; the start time is re-checked each second, which also
    covers a pid reused before the pidfd was opened, and systems without pidfd_open."""
    try:
        pidfd: int | None = current().pidfd_open(pid)
    except OSError:
        pidfd = None
    try:
        while same_process_alive(pid, start):
            if pidfd is None:
                await anyio.sleep(recheck_s)
                continue
            with anyio.move_on_after(recheck_s):
                await anyio.wait_readable(pidfd)
    finally:
        if pidfd is not None:
            with contextlib.suppress(Exception):
                anyio.notify_closing(pidfd)
            os.close(pidfd)
