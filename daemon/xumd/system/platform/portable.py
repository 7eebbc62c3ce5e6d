"""The portable backend: psutil and POSIX calls only, what macOS and the BSDs have.

No child subreaper, no cgroups, no pidfds, no mount ids, no parent-death signal: what that
costs is `WEAKER` (shown in `daemon.status` details.platform, docs/RELIABILITY.md "Platforms").
Selected on Linux with `XUM_PLATFORM=portable`, so CI runs the contract's tests against it.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from xumd.system.platform.common import PathUser, inside, is_exhausted

NAME = "portable"
CGROUPS = False
O_LOOK = os.O_RDONLY

WEAKER = (
    "no child subreaper: an orphan that leaves its session is found again by its marker "
    "(after a run, at start-up), never reaped by the daemon",
    "no cgroups: a descendant that clears its environment and leaves its session is not "
    "found again",
    "no pidfds: a leftover is signalled by pid, right after its marker and start time are "
    "read again",
    "no parent-death signal: a command running when the daemon dies runs on until the next "
    "start's sweep stops it",
    "no mount ids: a bind mount of a checkout's own filesystem is known by the mount table, "
    "read again as each deletion starts, and by its listing's inode as a walk opens it, with "
    "no mount id to confirm it (a directory swapped for another while a walk runs is left "
    "in place as a mount)",
    "no hole punching: keep_processes is off (processes.keep_problem says why); every process "
    "stops with the daemon",
    "process start times from psutil's create_time: a wall-clock step moves them",
)

_STATES = {
    psutil.STATUS_RUNNING: "R",
    psutil.STATUS_SLEEPING: "S",
    psutil.STATUS_DISK_SLEEP: "D",
    psutil.STATUS_STOPPED: "T",
    psutil.STATUS_TRACING_STOP: "t",
    psutil.STATUS_ZOMBIE: "Z",
    psutil.STATUS_DEAD: "X",
}


def _could_not_look(exc: BaseException, strict: bool) -> None:
    """Raise for a read that failed for want of descriptors (or, `strict`, for any reason but
    the process being gone): could not look is not "no such process"."""
    if is_exhausted(exc):
        raise exc
    if strict and isinstance(exc, psutil.AccessDenied):
        raise PermissionError(f"cannot read process {exc.pid}") from exc
    if strict and isinstance(exc, OSError):
        raise exc


# -- process identity ---------------------------------------------------------------------------


def boot_id() -> str | None:
    return None


def kernel_boot_time() -> float:
    return float(psutil.boot_time())


def since_boot() -> float | None:
    return None


def start_since_boot(pid: int, *, strict: bool = False) -> tuple[float, bool] | None:
    try:
        proc = psutil.Process(pid)
        created = proc.create_time()
        zombie = proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return None
    except (OSError, psutil.Error) as exc:
        _could_not_look(exc, strict)
        return None
    return created - kernel_boot_time(), zombie


def kernel_create_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except (OSError, psutil.Error):
        return None


def tree_since_boot(root: int) -> dict[int, float | None]:
    """root and every descendant with its start since boot (two reads per member: a pid that
    ends and is reused in between is told apart by its start time, read last)."""
    try:
        members = [root, *(c.pid for c in psutil.Process(root).children(recursive=True))]
    except psutil.Error:
        return {}
    found: dict[int, float | None] = {}
    for pid in members:
        start = start_since_boot(pid)
        found[pid] = start[0] if start is not None else None
    return found


# -- processes ----------------------------------------------------------------------------------


def pids() -> list[int]:
    try:
        return list(psutil.pids())
    except OSError as exc:
        if is_exhausted(exc):
            raise
        return []


def state(pid: int) -> str | None:
    try:
        status = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return None
    except (OSError, psutil.Error):
        return "?"
    return _STATES.get(status, "S")


def may_be_mid_exec(pid: int) -> bool:
    return state(pid) in ("R", "D")


def environ(pid: int) -> bytes | None:
    try:
        env = psutil.Process(pid).environ()
    except (OSError, psutil.Error) as exc:
        _could_not_look(exc, strict=False)
        return None
    return b"".join(os.fsencode(f"{key}={value}") + b"\0" for key, value in env.items())


def argv(pid: int) -> tuple[str, ...]:
    try:
        return tuple(psutil.Process(pid).cmdline())
    except (OSError, psutil.Error):
        return ()


def own_children() -> set[int]:
    try:
        return {c.pid for c in psutil.Process().children()}
    except psutil.Error:
        return set()


def exe(pid: int) -> str | None:
    try:
        return os.path.realpath(psutil.Process(pid).exe())
    except (OSError, psutil.Error):
        return None


def name(pid: int) -> str:
    try:
        return str(psutil.Process(pid).name())
    except (OSError, psutil.Error) as exc:
        _could_not_look(exc, strict=False)
        return ""


def cmdline(pid: int) -> bytes:
    try:
        command = psutil.Process(pid).cmdline()
    except (OSError, psutil.Error) as exc:
        _could_not_look(exc, strict=False)
        return b""
    return b"".join(os.fsencode(arg) + b"\0" for arg in command)


def processes_of(uid: int, named: Callable[[str], bool]) -> list[tuple[int, str, str]]:
    me = os.getpid()
    found: list[tuple[int, str, str]] = []
    for proc in psutil.process_iter(["pid", "name", "uids"]):
        info = proc.info
        uids = info.get("uids")
        if info["pid"] == me or uids is None or uids.real != uid:
            continue
        if not named(info.get("name") or ""):
            continue
        try:
            cwd = proc.cwd()
        except (OSError, psutil.Error) as exc:
            _could_not_look(exc, strict=False)
            continue
        found.append((info["pid"], info.get("name") or "", cwd))
    return found


def open_holders(wanted: set[str]) -> dict[str, int]:
    """Which of the paths in `wanted` some process has open (psutil's open regular files)."""
    held: dict[str, int] = {}
    for proc in psutil.process_iter(["pid"]):
        try:
            files = proc.open_files()
        except (OSError, psutil.Error) as exc:
            _could_not_look(exc, strict=False)
            continue
        for opened in files:
            if opened.path in wanted:
                held[opened.path] = proc.pid
    return held


def listeners(ports: set[int]) -> dict[int, set[int | None]]:
    """Who listens on each of `ports` (TCP, any address): pids, None where psutil cannot name
    the owner; a port nobody listens on is absent. psutil's whole connection table (on macOS
    it needs privileges to see other users' sockets): a table that cannot be read gives None
    for every port (holder unknown, never "nobody")."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (OSError, psutil.Error) as exc:
        _could_not_look(exc, strict=False)
        return {port: {None} for port in ports}
    found: dict[int, set[int | None]] = {}
    for conn in conns:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port in ports:
            found.setdefault(conn.laddr.port, set()).add(conn.pid)
    return found


# -- containment --------------------------------------------------------------------------------


def set_subreaper() -> str | None:
    return "no child subreaper on the portable backend"


def is_subreaper() -> bool:
    return False


def cgroup_delegated() -> Path | None:
    return None


def pidfd_open(pid: int) -> int | None:
    return None


def tool(name: str) -> str | None:
    return None


def copy_file_range(src: int, dst: int, count: int, src_pos: int, dst_pos: int) -> int:
    """No such call here (ENOSYS): the caller copies through its own buffer."""
    raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))


def fallocate() -> Callable[[int, int, int, int], int] | None:
    return None


def release_free_heap() -> bool:
    return False


# -- who uses a path ----------------------------------------------------------------------------


def users_under(
    root: str, exclude_pids: set[int], exclude_pgids: set[int], limit: int
) -> list[PathUser]:
    """Processes whose cwd or an open regular file (psutil's `open_files`) is under `root`."""
    me = os.getpid()
    found: list[PathUser] = []
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
            where = "cwd" if inside(cwd, root) else None
            if where is None and any(inside(f.path, root) for f in proc.open_files()):
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
                command = proc.cmdline()
            except (OSError, psutil.Error):
                command = []  # gone or unreadable meanwhile: it is still named by pid and name
            found.append(
                PathUser(pid, info.get("name") or "process", info["create_time"], where, command)
            )
            if len(found) >= limit:
                break
    return found


# -- mounts and descriptors ---------------------------------------------------------------------


def mount_table() -> list[tuple[str, str | None]]:
    """(mount point, filesystem type) of every mount psutil lists (all=True: pseudo and bind
    mounts too). A mount table that cannot be read raises (callers fail closed)."""
    return [(p.mountpoint, p.fstype or None) for p in psutil.disk_partitions(all=True)]


def mount_id(fd: int) -> int | None:
    return None


def open_fd_count() -> int:
    try:
        return int(psutil.Process().num_fds())
    except (OSError, psutil.Error):
        return -1


# -- the socket ---------------------------------------------------------------------------------


def unix_listener(path: str) -> bool:
    """Unknown without connecting (which would trigger socket activation): False."""
    return False


SOL_LOCAL = 0
LOCAL_PEERCRED = 1
LOCAL_PEERPID = 2
XUCRED_VERSION = 0
XUCRED = struct.Struct("=IIh2x16I")
"""macOS's struct xucred: cr_version, cr_uid, cr_ngroups, cr_groups[NGROUPS=16]."""


def peer_credentials(sock: socket.socket) -> tuple[int | None, int, int] | None:
    """(pid, uid, gid) of the peer: SO_PEERCRED where the kernel has it (Linux); else
    LOCAL_PEERCRED (uid, first group) and LOCAL_PEERPID (None where the kernel predates it)."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is not None:
        raw = sock.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i"))
        pid, uid, gid = struct.unpack("3i", raw)
        return pid, uid, gid
    if sys.platform != "darwin":
        return None
    uid, gid = parse_xucred(sock.getsockopt(SOL_LOCAL, LOCAL_PEERCRED, XUCRED.size))
    try:
        raw_pid = sock.getsockopt(SOL_LOCAL, LOCAL_PEERPID, struct.calcsize("i"))
    except OSError:
        return None, uid, gid
    return struct.unpack("i", raw_pid)[0], uid, gid


def parse_xucred(raw: bytes) -> tuple[int, int]:
    """(uid, gid) from a struct xucred; ValueError for a version or size this code does not know
    (the peer is then refused rather than guessed)."""
    if len(raw) < XUCRED.size:
        raise ValueError(f"struct xucred of {len(raw)} bytes, expected {XUCRED.size}")
    version, uid, ngroups, *groups = XUCRED.unpack(raw[: XUCRED.size])
    if version != XUCRED_VERSION:
        raise ValueError(f"struct xucred version {version}, expected {XUCRED_VERSION}")
    if not 1 <= ngroups <= len(groups):
        raise ValueError(f"struct xucred with {ngroups} groups")
    return uid, groups[0]


def launchd_functions() -> tuple[Any, Any] | None:
    """libSystem's launch_activate_socket(3) and free(3) (macOS); None elsewhere."""
    if sys.platform != "darwin":
        return None
    import ctypes  # here: a daemon started elsewhere never loads it

    # In the dyld shared cache, not on disk, since macOS 11: dlopen still finds it.
    libsystem = ctypes.CDLL("/usr/lib/libSystem.B.dylib", use_errno=True)
    function = libsystem.launch_activate_socket
    function.argtypes = [
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.POINTER(ctypes.c_int)),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    function.restype = ctypes.c_int
    libsystem.free.argtypes = [ctypes.c_void_p]
    return function, libsystem.free
