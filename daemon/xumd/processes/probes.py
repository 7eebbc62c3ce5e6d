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
import psutil

from xumd.system.fdlimits import is_exhausted
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


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


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
    if os.path.isdir("/proc/self/fd"):
        return _scan_proc(root, exclude_pids, exclude_pgids, limit)
    return _scan_psutil(root, exclude_pids, exclude_pgids, limit)


def _raise_if_exhausted(exc: OSError) -> None:
    if is_exhausted(exc):
        raise exc  # could not look inside this process: never "nobody uses the checkout"


def _scan_proc(
    root: str, exclude_pids: set[int], exclude_pgids: set[int], limit: int
) -> list[Usage]:
    """The same answer as `_scan_psutil`, for a fraction of its cost (every remove and archive
    pays it, for every process of the machine): the cwd and each descriptor are read as links
    first, and only a process found inside the checkout is looked at further (its
    state, group, name, start and command line). psutil read status, uids, start time and
    every descriptor's fdinfo of every process (~200 ms per probe with ~120 processes on a
    loaded 2-core machine; docs/PERFORMANCE.md, "Create and remove")."""
    me = os.getpid()
    found: list[Usage] = []
    try:
        names = os.listdir("/proc")
    except OSError as exc:
        _raise_if_exhausted(exc)
        return found
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == me or pid in exclude_pids:
            continue
        where = _where(pid, root)
        if where is None or not _counts(pid, exclude_pgids):
            continue
        try:
            proc = psutil.Process(pid)
            label, since = proc.name(), proc.create_time()
        except psutil.Error:
            continue  # gone meanwhile
        try:
            argv = proc.cmdline()
        except (OSError, psutil.Error):
            argv = []  # unreadable meanwhile: it is still named by pid and name
        found.append(Usage(pid, label or "process", since, where, argv))
        if len(found) >= limit:
            break
    return found


def _where(pid: int, root: str) -> str | None:
    """ "cwd" or "open file" when the process's cwd or an open regular file is inside root."""
    base = f"/proc/{pid}"
    try:
        if _inside(_readlink(f"{base}/cwd"), root):
            return "cwd"
        fds = os.listdir(f"{base}/fd")
    except OSError as exc:
        _raise_if_exhausted(exc)
        return None  # gone, a zombie, or not ours to read
    for fd in fds:
        try:
            target = _readlink(f"{base}/fd/{fd}")
        except OSError as exc:
            _raise_if_exhausted(exc)
            continue
        # Regular files only, as psutil's open_files (a pipe, socket or directory is not one).
        if target.startswith("/") and _inside(target, root) and os.path.isfile(target):
            return "open file"
    return None


def _readlink(path: str) -> str:
    """A /proc link's target as psutil reads it: a deleted target loses its " (deleted)"."""
    target = os.readlink(path).split("\x00")[0]
    if target.endswith(" (deleted)") and not os.path.exists(target):
        target = target[: -len(" (deleted)")]
    return target


def _counts(pid: int, exclude_pgids: set[int]) -> bool:
    """A process found inside: not a zombie, not of an excused group."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            status = f.read()
        pgid = os.getpgid(pid)
    except OSError as exc:
        _raise_if_exhausted(exc)
        return False
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    state = fields.get("State", "").strip()[:1]
    return state != "Z" and pgid not in exclude_pgids


def _scan_psutil(
    root: str, exclude_pids: set[int], exclude_pgids: set[int], limit: int
) -> list[Usage]:
    """Where there is no /proc to read directly."""
    me = os.getpid()
    found: list[Usage] = []
    for proc in psutil.process_iter(["pid", "name", "create_time", "status"]):
        info = proc.info
        pid = info["pid"]
        if pid == me or pid in exclude_pids:
            continue
        if info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        try:
            if os.getpgid(pid) in exclude_pgids:
                continue
            cwd = proc.cwd()
            where = "cwd" if _inside(cwd, root) else None
            if where is None and any(_inside(f.path, root) for f in proc.open_files()):
                where = "open file"
        except OSError as exc:
            if is_exhausted(exc):
                # Could not look inside this process: never "nobody uses the checkout".
                raise
            continue
        except psutil.Error:
            continue
        if where:
            try:
                argv = proc.cmdline()
            except (OSError, psutil.Error):
                argv = []  # gone or unreadable meanwhile: it is still named by pid and name
            found.append(
                Usage(pid, info.get("name") or "process", info["create_time"], where, argv)
            )
            if len(found) >= limit:
                break
    return found


async def leader_gone(pid: int, start: float | None, *, recheck_s: float = 1.0) -> None:
    """Return once the process (pid *and* start time) has ended. A pidfd becomes readable when
    any process ends, not only a child; the start time is re-checked each second, which also
    covers a pid reused before the pidfd was opened, and systems without pidfd_open."""
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except (OSError, AttributeError):
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
