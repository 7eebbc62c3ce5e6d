"""The Linux backend: /proc, prctl, pidfds, mountinfo, cgroup v2 (what every guarantee of
docs/RELIABILITY.md is written for).

The one reader of /proc/PID/stat (`stat_fields`) and of the mount table (`MOUNTINFO`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import shutil
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

from xumd.system.platform.common import ZOMBIE_STATES, PathUser, inside, is_exhausted

NAME = "linux"
CGROUPS = True
O_LOOK = os.O_PATH

# Not mutated: the fallback is Linux's USER_HZ, never taken on POSIX.
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # pragma: no mutate
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
MOUNTINFO = Path("/proc/self/mountinfo")
_FDINFO = "/proc/self/fdinfo/{fd}"
_OCTAL = re.compile(rb"\\([0-7]{3})")
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
PF_KTHREAD = 0x00200000
"""/proc/PID/stat's flags: a kernel thread (include/linux/sched.h)."""
_SO_ACCEPTCON = 0x00010000


# -- process identity ---------------------------------------------------------------------------


def boot_id() -> str | None:
    try:
        with open(_BOOT_ID, encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def kernel_boot_time() -> float:
    """The boot's wall-clock time as the kernel computes it now (moves with clock steps):
    /proc/stat's `btime`, what `psutil.boot_time()` reads on Linux (psutil is not imported on
    the way to readiness)."""
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
def timens_boottime_offset() -> float:
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


def since_boot() -> float | None:
    """Seconds since boot, suspend included (CLOCK_BOOTTIME): runs with real time whatever the
    wall clock does."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        return None
    return time.clock_gettime(boottime) - timens_boottime_offset()


def stat_fields(pid: int, *, strict: bool = False) -> list[str] | None:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses): field 0
    is the state letter. None when there is no such process. Out of descriptors or memory
    raises (`is_exhausted`); with `strict`, so does any other failed read, for a caller that
    must never take "could not read" for "gone"."""
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


def _ticks_since_boot(ticks_field: str) -> float:
    return int(ticks_field) / _CLK_TCK - timens_boottime_offset()


def start_since_boot(pid: int, *, strict: bool = False) -> tuple[float, bool] | None:
    """(start in seconds since boot, zombie), or None when there is no such process."""
    fields = stat_fields(pid, strict=strict)
    if fields is None or len(fields) < 20:
        return None
    return _ticks_since_boot(fields[19]), fields[0] in ZOMBIE_STATES


def kernel_create_time(pid: int) -> float | None:
    """The start as `psutil.Process(pid).create_time()` gives it: ticks after boot plus the
    kernel's boot time now (moves with wall-clock steps)."""
    fields = stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    return int(fields[19]) / _CLK_TCK + kernel_boot_time()


def tree_since_boot(root: int) -> dict[int, float | None]:
    """root and every descendant with its start since boot, from one scan in which a process's
    parent and its start come from the same read of its stat (a member that ends mid-scan, its
    pid handed to a stranger, never lends the stranger its place). Empty when root is gone."""
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
        starts[pid] = _ticks_since_boot(fields[19])
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
    found: dict[int, float | None] = {}
    for pid in pids:
        start = start_since_boot(pid)
        found[pid] = start[0] if start is not None else None
    return found


# -- processes: state, environment, command line, children ---------------------------------------


def pids() -> list[int]:
    """Every pid; empty where there is no way to list them. Out of descriptors raises."""
    try:
        names = os.listdir("/proc")
    except OSError as exc:
        if is_exhausted(exc):
            raise
        return []
    return [int(n) for n in names if n.isdigit()]


def state(pid: int) -> str | None:
    """The process's state letter; None when there is no such process. A read that fails for
    another reason (no descriptor left) is "?": unknown, never taken for gone."""
    try:
        fields = stat_fields(pid, strict=True)
    except OSError:
        return "?"
    return fields[0][:1] if fields else None


def may_be_mid_exec(pid: int) -> bool:
    """An empty environment that may be an exec in progress: a user process running or in an
    uninterruptible wait (an exec's waits are; one idle in `S` is not mid-exec)."""
    fields = stat_fields(pid)
    if fields is None or len(fields) < 7 or fields[0][:1] not in ("R", "D"):
        return False
    try:
        return not int(fields[6]) & PF_KTHREAD
    except ValueError:
        return True


def environ(pid: int) -> bytes | None:
    """The environment the process started with (NUL-separated); None when it cannot be read.
    Out of descriptors or memory raises."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError as exc:
        if is_exhausted(exc):
            raise
        return None


def argv(pid: int) -> tuple[str, ...]:
    """The process's command line; empty when it is gone (or a zombie, or a kernel thread)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)


def own_children() -> set[int]:
    """This process's children, adopted orphans included: each thread's
    `/proc/PID/task/TID/children`; psutil's scan where the kernel lacks it."""
    found: set[int] = set()
    task_dir = Path(f"/proc/{os.getpid()}/task")
    try:
        tasks = os.listdir(task_dir)
        for tid in tasks:
            with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                text = (task_dir / tid / "children").read_text()
                found.update(int(p) for p in text.split())
                continue
            if not (task_dir / tid).exists():
                continue  # the thread ended meanwhile
            raise FileNotFoundError("no children file")
    except (OSError, ValueError):
        import psutil

        try:
            return {c.pid for c in psutil.Process().children()}
        except psutil.Error:
            return found
    return found


def exe(pid: int) -> str | None:
    """The resolved path of the program the process runs now; None when unknown."""
    try:
        return os.path.realpath(f"/proc/{pid}/exe")
    except OSError:
        return None


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(256 * 1024)
    except OSError as exc:
        if is_exhausted(exc):
            # Out of descriptors is not "no such process": a scan that could not look must
            # not conclude that nobody holds a lock (fail closed; the caller answers).
            raise
        return b""


def name(pid: int) -> str:
    """The process's command name (comm); empty when it is gone. Out of descriptors raises."""
    return _read(f"/proc/{pid}/comm").decode(errors="replace").strip()


def cmdline(pid: int) -> bytes:
    """The process's command line as the kernel keeps it (NUL-separated bytes); empty when it
    cannot be read. Out of descriptors raises."""
    return _read(f"/proc/{pid}/cmdline")


def processes_of(uid: int, named: Callable[[str], bool]) -> list[tuple[int, str, str]]:
    """(pid, name, cwd) of each process of `uid` whose name `named` accepts (a zombie, with no
    cwd left, is not one). Out of descriptors raises."""
    me = os.getpid()
    found: list[tuple[int, str, str]] = []
    for pid in owned_by({uid}):
        if pid == me:
            continue
        try:
            comm = name(pid)
            if not named(comm):
                continue
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError as exc:
            if is_exhausted(exc):
                raise
            continue
        found.append((pid, comm, cwd))
    return found


def owned_by(uids: set[int]) -> list[int]:
    """The pids of the processes owned by one of `uids` (those /proc lists; gone ones are
    skipped). Out of descriptors raises."""
    chosen: list[int] = []
    try:
        entries = list(os.scandir("/proc"))
    except OSError as exc:
        if is_exhausted(exc):
            raise
        return chosen
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid in uids:
                chosen.append(int(entry.name))
        except OSError as exc:
            if is_exhausted(exc):
                raise
    return chosen


def open_holders(wanted: set[str]) -> dict[str, int]:
    """Which of the paths in `wanted` some process has open (by /proc/<pid>/fd): path -> pid.
    Out of descriptors raises: could not look is never "nobody has it open"."""
    held: dict[str, int] = {}
    for entry in os.scandir("/proc"):  # unlistable raises: never "nobody has it open"
        if not entry.name.isdigit():
            continue
        fd_dir = f"/proc/{entry.name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError as exc:
            if is_exhausted(exc):
                raise  # could not look: never "nobody has it open"
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target in wanted:
                held[target] = int(entry.name)
    return held


_NET_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_TCP_LISTEN = "0A"
"""include/net/tcp_states.h: TCP_LISTEN, as /proc/net/tcp prints a socket's state."""


def listeners(ports: set[int]) -> dict[int, set[int | None]]:
    """Who listens on each of `ports` (TCP, any address): pids, None where the socket's owner
    cannot be found (another user's process, whose descriptors this one cannot read). A port
    nobody listens on is absent. /proc/net/tcp{,6} name each listening socket by inode and
    uid; the descriptor tables of that uid's processes are then read until every socket is
    placed, so a server of the workspace's own is found without reading every process's
    table. Out of descriptors raises; a table that cannot be read gives None for every port
    (asked about a port the bind probe found busy: holder unknown, never "nobody")."""
    sockets: dict[int, int] = {}  # socket inode -> port
    uids: set[int] = set()
    for table in _NET_TABLES:
        try:
            with open(table, encoding="ascii") as f:
                lines = f.readlines()[1:]
        except FileNotFoundError:
            continue  # no IPv6 in this kernel
        except OSError as exc:
            if is_exhausted(exc):
                raise
            return {port: {None} for port in ports}
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _TCP_LISTEN:
                continue
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if port in ports:
                sockets[int(fields[9])] = port
                uids.add(int(fields[7]))
    found: dict[int, set[int | None]] = {}
    pending = dict(sockets)
    # Newest first: a server a workspace started is likelier recent than the session's own.
    for pid in sorted(owned_by(uids), reverse=True) if pending else []:
        for ino in _socket_inodes(pid) & pending.keys():
            found.setdefault(sockets[ino], set()).add(pid)
            del pending[ino]
        if not pending:
            break
    for port in pending.values():
        found.setdefault(port, set()).add(None)
    return found


def _socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets `pid` holds a descriptor of (empty when it cannot be read)."""
    held: set[int] = set()
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError as exc:
        if is_exhausted(exc):
            raise
        return held
    for fd in fds:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError as exc:
            if is_exhausted(exc):
                raise
            continue
        if target.startswith("socket:["):
            held.add(int(target[8:-1]))
    return held


# -- containment: subreaper, cgroups, pidfds ----------------------------------------------------


@functools.cache
def _libc() -> ctypes.CDLL:
    # glibc's soname first: `ctypes.util.find_library` runs ldconfig (a child process) and its
    # import brings shutil, tempfile and lzma, all before readiness. It stays the fallback
    # for a libc by another name (musl).
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        from ctypes.util import find_library

        return ctypes.CDLL(find_library("c") or "libc.so.6", use_errno=True)


def release_free_heap() -> bool:
    """Hand the C heap's free pages back to the system (glibc's `malloc_trim(0)`: its arenas
    keep what a peak freed); False where the libc has no such call (musl)."""
    try:
        trim = _libc().malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True


def set_subreaper() -> str | None:
    """Make this process the child subreaper of its descendants; why not, or None."""
    try:
        if _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return f"prctl errno {ctypes.get_errno()}"
    except OSError as exc:
        return str(exc)
    return None


def is_subreaper() -> bool:
    try:
        value = ctypes.c_int(0)
        if _libc().prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0) != 0:
            return False
    except OSError:
        return False
    return value.value != 0


def cgroup_delegated(
    proc_cgroup: Path = Path("/proc/self/cgroup"), mount: Path = Path("/sys/fs/cgroup")
) -> Path | None:
    """The daemon's own cgroup v2 directory when it is delegated to us (systemd `Delegate=yes`:
    a pure v2 hierarchy, our cgroup writable, not the root), else None."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    # A v1 or hybrid host lists controllers on other lines; only the unified one counts.
    if len(lines) != 1 or not lines[0].startswith("0::"):
        return None
    relative = lines[0][3:].strip().lstrip("/")
    if not relative:
        return None
    directory = mount / relative
    if not (mount / "cgroup.controllers").exists() or not directory.is_dir():
        return None
    if not os.access(directory / "cgroup.procs", os.W_OK) or not os.access(directory, os.W_OK):
        return None
    return directory


def pidfd_open(pid: int) -> int | None:
    """A pidfd pinning the process (None where the kernel has none: signals go by pid).
    ESRCH raises ProcessLookupError; out of descriptors raises."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    fd: int = opener(pid)
    return fd


def tool(name: str) -> str | None:
    """A util-linux helper (setpriv, prlimit) on PATH."""
    return shutil.which(name)


def copy_file_range(src: int, dst: int, count: int, src_pos: int, dst_pos: int) -> int:
    """copy_file_range(2): the kernel copies (or clones) without the bytes passing through us."""
    return os.copy_file_range(src, dst, count, src_pos, dst_pos)


def fallocate() -> Callable[[int, int, int, int], int] | None:
    """glibc's fallocate (punching holes in output logs)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = getattr(libc, "fallocate64", None) or libc.fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    found: Callable[[int, int, int, int], int] = fn
    return found


# -- who uses a path ----------------------------------------------------------------------------


def users_under(
    root: str, exclude_pids: set[int], exclude_pgids: set[int], limit: int
) -> list[PathUser]:
    """Processes whose cwd or an open regular file is under `root` (canonical). The cwd and each
    descriptor are read as links first, and only a process found inside is looked at further
    (psutil read status, uids, start time and every descriptor's fdinfo of every process:
    ~200 ms per probe with ~120 processes on a loaded 2-core machine; docs/PERFORMANCE.md)."""
    import psutil

    me = os.getpid()
    found: list[PathUser] = []
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
            command = proc.cmdline()
        except (OSError, psutil.Error):
            command = []  # unreadable meanwhile: it is still named by pid and name
        found.append(PathUser(pid, label or "process", since, where, command))
        if len(found) >= limit:
            break
    return found


def _raise_if_exhausted(exc: OSError) -> None:
    if is_exhausted(exc):
        raise exc  # could not look inside this process: never "nobody uses the checkout"


def _where(pid: int, root: str) -> str | None:
    """ "cwd" or "open file" when the process's cwd or an open regular file is inside root."""
    base = f"/proc/{pid}"
    try:
        if inside(_readlink(f"{base}/cwd"), root):
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
        if target.startswith("/") and inside(target, root) and os.path.isfile(target):
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
    letter = fields.get("State", "").strip()[:1]
    return letter != "Z" and pgid not in exclude_pgids


# -- mounts and descriptors ---------------------------------------------------------------------


def decode_mount_field(raw: bytes) -> str:
    """A mountinfo path field: the kernel escapes space, tab, newline and backslash as `\\ooo`
    (octal); other bytes are raw (a UTF-8 name stays UTF-8)."""
    return os.fsdecode(_OCTAL.sub(lambda m: bytes([int(m.group(1), 8)]), raw))


def parse_mount_table(data: bytes) -> list[tuple[str, str | None]]:
    """(mount point, filesystem type) of each line of a mountinfo text, decoded, in table
    order. The point is field 5; the type follows the `-` that ends the optional fields (None
    on a line without one)."""
    table: list[tuple[str, str | None]] = []
    for line in data.splitlines():
        fields = line.split(b" ")
        if len(fields) < 5:
            continue
        fstype: str | None = None
        if b"-" in fields[6:]:
            after = fields.index(b"-", 6) + 1
            fstype = os.fsdecode(fields[after]) if after < len(fields) else None
        table.append((decode_mount_field(fields[4]), fstype))
    return table


def mount_table() -> list[tuple[str, str | None]]:
    """(mount point, filesystem type) of every mount this process sees, in table order; empty
    when there is no table. Another error reading it raises (callers fail closed)."""
    try:
        data = MOUNTINFO.read_bytes()
    except FileNotFoundError:
        return []
    return parse_mount_table(data)


def mount_id(fd: int) -> int | None:
    """The mount id of an open file (`mnt_id` in /proc/self/fdinfo); None where unknown."""
    try:
        with open(_FDINFO.format(fd=fd), "rb") as info:
            for line in info:
                if line.startswith(b"mnt_id:"):
                    return int(line.split(b":", 1)[1])
    except (OSError, ValueError):
        return None
    return None


def open_fd_count() -> int:
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # minus the listing's own descriptor
    except OSError:
        return -1


# -- the socket ---------------------------------------------------------------------------------


def unix_listener(path: str) -> bool:
    """Whether some process listens on the Unix socket bound at `path` (/proc/net/unix)."""
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as table:
            next(table, None)  # header
            for line in table:
                fields = line.split(None, 7)
                listening = len(fields) == 8 and int(fields[3], 16) & _SO_ACCEPTCON
                if listening and fields[7].rstrip("\n") == path:
                    return True
    except (OSError, ValueError):
        return False
    return False


def peer_credentials(sock: socket.socket) -> tuple[int | None, int, int] | None:
    """(pid, uid, gid) of the peer (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def launchd_functions() -> None:
    """No launchd on Linux."""
    return None


WEAKER: tuple[str, ...] = ()
"""What this backend cannot guarantee: nothing beyond what daemon.status's containment says."""
