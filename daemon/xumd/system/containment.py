"""Process containment: every process the daemon starts, and every descendant, can be found again.

Process groups and a walk of the process tree do not reach a descendant that double-forks into
its own session (`setsid sh -c 'sleep 100' &`): it leaves the group, and once its parent exits it
is re-parented away from the tree. Nor do they reach anything after a daemon crash. These
mechanisms close the gap (docs/PROCESSES.md, "Containment"):

- **Child subreaper** (`prctl(PR_SET_CHILD_SUBREAPER)`, set by `xumd` at start on Linux):
  orphaned descendants are re-parented to the daemon rather than to init, so the daemon sees
  them as its own (foreign) children, and reaps them when they end (`reap_orphans`).
- **Marker**: every child gets `XUM_RUN=<root-tag>:<daemon-instance>:<record>` in its
  environment, and every descendant inherits it (readable in `/proc/PID/environ`, which a
  process cannot change afterwards). The record is durable where the run is: a setup/teardown
  command's lease id (written before the command starts), a supervised process's id (its lease
  names it). After a command ends, whatever still carries its marker is stopped; at start-up,
  whatever carries a marker of another daemon instance of this root is stopped unless it belongs
  to a live supervised process that adoption takes over.

Signals go through a pidfd opened *before* the marker is read again: the pidfd pins the process,
so a pid recycled between the scan and the signal is never hit (the re-read sees the new
process's environment, which does not carry the marker).

- **A cgroup per run** where a cgroup v2 is delegated (systemd `Delegate=yes`) or configured
  (`RunCgroups`): it also holds a descendant that clears its environment (`env -i`), which
  carries no marker (without a cgroup the subreaper still sees it, but only reaps it).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import select
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from xumd.base import logs
from xumd.system import procstat
from xumd.system.fdlimits import child_soft
from xumd.system.platform import current

log = logs.get("xumd.system.containment")

MARKER_VAR = "XUM_RUN"
ESCAPED_KEPT = 64

# -- our own children ---------------------------------------------------------------------------
# The asyncio child watcher and Popen wait for the children the daemon started by pid; the orphan
# reaper must never reap one of those (that would steal its exit status). Every start registers
# its pid here; while a start is between fork and registration, the reaper skips its round.

_own: set[int] = set()
_starting = 0
_subreaper = False
"""Set by enable_subreaper: only then can a child be one we did not start (an orphan)."""


def starting() -> None:
    global _starting
    _starting += 1


def started(pid: int | None) -> None:
    global _starting
    _starting = max(0, _starting - 1)
    if pid:
        _own.add(pid)


def register(pid: int) -> None:
    _own.add(pid)


def waited(pid: int) -> None:
    """The child's exit status was read: its pid is no longer ours."""
    _own.discard(pid)


def direct_children() -> set[int]:
    """The daemon's children, adopted orphans included (the platform backend's answer)."""
    return current().own_children()


def foreign_children() -> set[int]:
    return direct_children() - _own


def _state(pid: int) -> str | None:
    """The process's state letter; None when there is no such process. A read that fails for
    another reason (no descriptor left) is "?": unknown, never taken for gone."""
    return current().state(pid)


def reap_orphans() -> list[int]:
    """Reap ended orphans the subreaper adopted; never a child the daemon itself waits for."""
    if _starting or not _subreaper:
        return []
    reaped: list[int] = []
    for pid in foreign_children():
        if _state(pid) != "Z":
            continue
        with contextlib.suppress(ChildProcessError, OSError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped.append(pid)
    if reaped:
        log.debug("containment.reaped", pids=reaped)
    return reaped


# -- subreaper and cgroup ----------------------------------------------------------------------


def enable_subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux); False where it cannot."""
    global _subreaper
    why = current().set_subreaper()
    if why is not None:
        log.warning("containment.subreaper_failed", error=why)
        return False
    _subreaper = True
    return True


def is_subreaper() -> bool:
    return current().is_subreaper()


def cgroup_delegated() -> Path | None:
    """The daemon's own cgroup v2 directory when it is delegated to us (systemd `Delegate=yes`),
    else None (always on a backend without cgroups)."""
    return current().cgroup_delegated()


# What every Python shim that execs a program runs first, so the program starts as a service
# manager starts one: each signal at its default, none blocked. Python ignores SIGPIPE and SIGXFSZ
# and catches SIGINT at start-up, and an ignored signal stays ignored across exec (a program would
# never die of a closed pipe; a SIGINT caught by Python's flag-setting handler just before the exec
# was lost); a launcher's ignored SIGHUP or SIGINT (`nohup`, a background job) must not reach
# the programs either.
SHIM_PROLOGUE = """
import _signal
for _sig in range(1, _signal.NSIG):
    try:
        _signal.signal(_sig, _signal.SIG_DFL)
    except (OSError, ValueError):
        pass
_signal.pthread_sigmask(_signal.SIG_SETMASK, ())
"""


def shim_prologue() -> str:
    """SHIM_PROLOGUE, and the soft RLIMIT_NOFILE the daemon started with put back when the
    daemon raised its own (fdlimits.child_soft says why); the hard limit is left as it is.
    Built at each start: the daemon raises its limit after the modules are imported."""
    soft = child_soft()
    if soft is None:
        return SHIM_PROLOGUE
    return SHIM_PROLOGUE + _NOFILE.format(soft=int(soft))


_NOFILE = """
import resource as _resource
_soft, _hard = _resource.getrlimit(_resource.RLIMIT_NOFILE)
if _soft == _resource.RLIM_INFINITY or _soft > {soft}:
    try:
        _resource.setrlimit(_resource.RLIMIT_NOFILE, ({soft}, _hard))
    except (OSError, ValueError):
        pass
"""
# A run joins its cgroup itself, before it execs the command: nothing it starts can be outside.
# (Python's subprocess cannot fork into a cgroup; a program, not a pre-exec hook, because forking
# Python code in a threaded daemon is not safe.) A run that cannot join does not run: exit 126.
_JOIN = """
import os, sys
try:
    with open(sys.argv[1], "w") as f:
        f.write("0")
except OSError as exc:
    sys.stderr.write(f"xum: cannot join the run's cgroup {sys.argv[1]}: {exc.strerror}\\n")
    os._exit(126)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.stderr.write(f"xum: cannot run {sys.argv[2]}: {exc.strerror}\\n")
    os._exit(127)
"""


def cgroup_v2_dir(path: Path) -> bool:
    """A cgroup v2 directory we may create runs under (never on a backend without cgroups)."""
    return current().CGROUPS and (path / "cgroup.procs").is_file() and os.access(path, os.W_OK)


@dataclass
class RunCgroups:
    """One cgroup v2 directory per run (`<base>/xum-<root-tag>/run-<record>`): a run and every
    descendant stay inside whatever they do (setsid, double fork, a fresh environment), and a
    kill of the cgroup (`cgroup.kill`) reaches all of them. No controller is enabled, so the
    daemon may stay in the delegated cgroup itself."""

    base: Path
    on_failure: Callable[[str], None] | None = field(default=None, compare=False)
    """Told when a run has to start without its cgroup (daemon.status shows it)."""

    def directory(self, record: str) -> Path:
        return self.base / f"run-{record}"

    def create(self, record: str) -> Path:
        self.base.mkdir(exist_ok=True)
        path = self.directory(record)
        path.mkdir(exist_ok=True)
        return path

    def join_argv(self, record: str, argv: list[str]) -> list[str]:
        try:
            procs = self.create(record) / "cgroup.procs"
        except OSError as exc:
            # The cgroup went away under us (or is full): the run still has its marker and the
            # subreaper; refusing every git command would stop the daemon altogether.
            log.warning("containment.cgroup_failed", cgroup=str(self.base), error=str(exc))
            if self.on_failure is not None:
                self.on_failure(f"{self.base}: {exc.strerror or exc}")
            return list(argv)
        return [sys.executable, "-I", "-S", "-c", shim_prologue() + _JOIN, str(procs), *argv]

    @staticmethod
    def members(path: Path) -> list[int]:
        try:
            return [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    async def stop(
        self,
        record: str,
        grace_s: float,
        *,
        poll_s: float = 0.02,
        stopped: list[Stopped] | None = None,
    ) -> list[int]:
        """SIGTERM every member, `cgroup.kill` after the grace, remove the directory; returns
        the members still there after the kill (bounded wait). `stopped` is told each member
        that ended, with the signal that ended it."""
        path = self.directory(record)
        if not path.is_dir():
            return []
        members = self.members(path)
        if members:
            # Who they were, read before the signal: a process that ended has no cmdline.
            known = {pid: (_start(pid), argv_of(pid)) for pid in members}
            for pid in members:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self.members(path) and time.monotonic() < deadline:
                await anyio.sleep(poll_s)
            killed = set(self.members(path))
            if killed:
                self._kill(path)
            deadline = time.monotonic() + 2.0
            while self.members(path) and time.monotonic() < deadline:
                await anyio.sleep(poll_s)
            log.info("containment.cgroup_stopped", cgroup=str(path), pids=members)
            if stopped is not None:
                still = set(self.members(path))
                add_stopped(
                    stopped,
                    (
                        Stopped.of(pid, start, argv, pid in killed)
                        for pid, (start, argv) in known.items()
                        if pid not in still
                    ),
                )
        left = self.members(path)
        if not left:
            # Empty: removable (its last members may still be zombies for a moment).
            deadline = time.monotonic() + 2.0
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        log.warning("containment.cgroup_not_removed", cgroup=str(path))
                        break
                    reap_orphans()
                    await anyio.sleep(poll_s)
        return left

    @staticmethod
    def _kill(path: Path) -> None:
        try:
            (path / "cgroup.kill").write_text("1")
        except OSError:
            # Kernels before 5.14 have no cgroup.kill: SIGKILL each member.
            for pid in RunCgroups.members(path):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def records(self) -> list[str]:
        try:
            names = os.listdir(self.base)
        except OSError:
            return []
        return [n[len("run-") :] for n in names if n.startswith("run-")]


# -- markers -----------------------------------------------------------------------------------


def root_tag(root: Path) -> str:
    """Identifies the root in a marker: other roots' daemons (and their children) never match."""
    return hashlib.sha256(os.fsencode(os.path.realpath(root))).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Marker:
    tag: str
    instance: str
    record: str

    def __str__(self) -> str:
        return f"{self.tag}:{self.instance}:{self.record}"

    @classmethod
    def parse(cls, value: str) -> Marker | None:
        parts = value.split(":")
        if len(parts) != 3 or not all(parts):
            return None
        return cls(*parts)


@dataclass(frozen=True, slots=True)
class Marked:
    pid: int
    marker: Marker
    start: float | None
    argv: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        return {"pid": self.pid, "marker": str(self.marker), "argv": list(self.argv)}


@dataclass(frozen=True, slots=True)
class Stopped:
    """A process a run left behind that containment stopped when the run ended: what the
    run's record says, so the stop is never silent (the protocol's `StoppedLeftover`)."""

    pid: int
    argv: tuple[str, ...]
    signal: str
    """The signal that ended it: SIGTERM, or SIGKILL when it outlived the grace."""
    ran_s: float | None
    """How long it had run when it was stopped (None: its start time was not known)."""

    @classmethod
    def of(cls, pid: int, start: float | None, argv: Iterable[str], killed: bool) -> Stopped:
        ran = None if start is None else max(0.0, round(procstat.anchored_now() - start, 3))
        return cls(pid, tuple(argv), "SIGKILL" if killed else "SIGTERM", ran)

    def describe(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "argv": list(self.argv),
            "signal": self.signal,
            "ran_s": self.ran_s,
        }


def add_stopped(into: list[Stopped], found: Iterable[Stopped]) -> None:
    """Add to `into` the ones it does not name yet (one process is found by several means:
    its group, its marker, its cgroup)."""
    known = {s.pid for s in into}
    for item in found:
        if item.pid not in known:
            into.append(item)
            known.add(item.pid)


EXEC_SETTLE_S = 0.05
"""How long a user process that shows an empty environment is read again. Mid-exec the kernel
shows no environment for a moment (the old program's is gone; the new one's is published after
its argv, `create_elf_tables`), and a process preempted there (a busy machine) shows none for a
scheduling quantum or two. Without the wait, a marked process caught mid-exec (a script's loop
starting a command) was taken for unmarked: a sweep missed it (docs/RELIABILITY.md, "Class:
process containment across crashes"). Kernel threads and zombies, which have no environment,
are not waited for, nor a process idle with an empty one (`env -i`): only one running or in
an uninterruptible wait, as an exec is."""


def _may_be_mid_exec(pid: int) -> bool:
    """An empty environment that may be an exec in progress: a user process running or in an
    uninterruptible wait (an exec's waits are; one idle in `S` is not mid-exec, so a sleeping
    `env -i` process costs no wait)."""
    return current().may_be_mid_exec(pid)


def _environ(pid: int) -> bytes | None:
    return current().environ(pid)


def read_marker(pid: int) -> Marker | None:
    """The process's marker, None without one (or no such process, or not ours to read).
    Out of descriptors or memory raises: could not look is not "no marker"."""
    data = _environ(pid)
    if data == b"" and _may_be_mid_exec(pid):
        deadline = time.monotonic() + EXEC_SETTLE_S
        while data == b"" and time.monotonic() < deadline:
            time.sleep(0.001)  # bounded: EXEC_SETTLE_S in all, only for such a process
            data = _environ(pid)
    if data is None:
        return None
    key = MARKER_VAR.encode() + b"="
    for entry in data.split(b"\0"):
        if entry.startswith(key):
            return Marker.parse(entry[len(key) :].decode(errors="replace"))
    return None


def _start(pid: int, *, strict: bool = False) -> float | None:
    # procstat's identity (boot anchor + ticks): stable across wall-clock steps.
    return procstat.start_time(pid, strict=strict)


def argv_of(pid: int) -> tuple[str, ...]:
    """The process's command line; empty when it is gone (or a zombie, or a kernel thread)."""
    return current().argv(pid)


def scan(tag: str, match: Callable[[Marker], bool] = lambda _: True) -> list[Marked]:
    """Every live process carrying a marker of this root (zombies have no environment). Out of
    descriptors raises: could not look is not "none left"."""
    me = os.getpid()
    found: list[Marked] = []
    for pid in current().pids():
        if pid == me:
            continue
        marker = read_marker(pid)
        if marker is None or marker.tag != tag or not match(marker):
            continue
        found.append(Marked(pid, marker, _start(pid), argv_of(pid)))
    return found


# -- stopping ----------------------------------------------------------------------------------

# A test seam: the signal sender, so a test can make one process unstoppable (a fault that a
# real process cannot be made to show: SIGKILL cannot be refused).
SendSignal = Callable[[int | None, int, int], None]


def _pidfd_send(pidfd: int | None, pid: int, sig: int) -> None:
    if pidfd is None:
        os.kill(pid, sig)  # no pidfds: by pid, right after the marker and start were re-read
    else:
        signal.pidfd_send_signal(pidfd, sig)


send_signal: SendSignal = _pidfd_send


@dataclass
class _Pinned:
    marked: Marked
    pidfd: int | None
    """None where the backend has no pidfds."""
    gone: bool = False


def _pin(marked: Marked) -> _Pinned | None:
    """A pidfd for the process, kept only when the process it refers to still carries the
    marker and the start time: a recycled pid is never signalled."""
    try:
        pidfd = current().pidfd_open(marked.pid)
    except ProcessLookupError:
        return None
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            return None
        raise  # e.g. no descriptor left: not "gone"; the caller counts it as not stopped
    try:
        again = read_marker(marked.pid)
        # Strict: a start time that could not be read is not "another process" (never
        # signalled nor reported): it raises, and the caller counts the process as not stopped.
        start = _start(marked.pid, strict=True)
    except OSError:
        if pidfd is not None:
            os.close(pidfd)  # could not look: no descriptor kept (it is the one that ran out)
        raise
    same_start = marked.start is None or (
        start is not None and abs(start - marked.start) < procstat.START_TOLERANCE_S
    )
    if again != marked.marker or not same_start:
        if pidfd is not None:
            os.close(pidfd)
        return None
    return _Pinned(marked, pidfd)


def _signal(pinned: _Pinned, sig: int) -> None:
    if pinned.gone:
        return
    try:
        send_signal(pinned.pidfd, pinned.marked.pid, sig)
    except ProcessLookupError:
        pinned.gone = True
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            pinned.gone = True


def _ended(pinned: _Pinned) -> bool:
    if pinned.gone:
        return True
    state = _state(pinned.marked.pid)
    # A pidfd turns readable when its process ends (zombie or reaped).
    readable = False
    if pinned.pidfd is not None:
        readable = bool(select.select([pinned.pidfd], [], [], 0)[0])
    if readable or state in (None, "Z", "X"):
        pinned.gone = True
    return pinned.gone


async def stop_marked(
    found: Iterable[Marked],
    grace_s: float,
    *,
    poll_s: float = 0.02,
    kill_wait_s: float = 2.0,
    stopped: list[Stopped] | None = None,
) -> list[Marked]:
    """SIGTERM each, SIGKILL what is left after `grace_s`; returns the ones still alive after
    the SIGKILL (bounded wait). Adopted orphans among them are reaped. `stopped` is told each
    one that ended, with the signal that ended it."""
    pinned: list[_Pinned] = []
    unpinned: list[Marked] = []
    for m in found:
        if m.pid <= 0:
            continue  # a placeholder for "could not look", not a process
        try:
            p = _pin(m)
        except OSError as exc:
            # Could not look is not "stopped": reported among the survivors (fail closed).
            log.warning("containment.unpinned", pid=m.pid, error=str(exc))
            unpinned.append(m)
            continue
        if p is not None:
            pinned.append(p)
    try:
        if not pinned:
            return unpinned
        for p in pinned:
            _signal(p, signal.SIGCONT)
            _signal(p, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and not all(_ended(p) for p in pinned):
            await anyio.sleep(poll_s)
        killed: set[int] = set()
        for p in pinned:
            if not _ended(p):
                _signal(p, signal.SIGKILL)
                killed.add(p.marked.pid)
        deadline = time.monotonic() + kill_wait_s
        while time.monotonic() < deadline and not all(_ended(p) for p in pinned):
            await anyio.sleep(poll_s)
        left = [p.marked for p in pinned if not _ended(p)] + unpinned
        if stopped is not None:
            add_stopped(
                stopped,
                (
                    Stopped.of(m.pid, m.start, m.argv, m.pid in killed)
                    for m in (p.marked for p in pinned)
                    if m not in left
                ),
            )
        for p in pinned:
            log.info(
                "containment.stopped" if _ended(p) else "containment.survived",
                pid=p.marked.pid,
                marker=str(p.marked.marker),
            )
        return left
    finally:
        for p in pinned:
            if p.pidfd is not None:
                with contextlib.suppress(OSError):
                    os.close(p.pidfd)
        reap_orphans()


# -- the daemon's containment --------------------------------------------------------------------


@dataclass
class Containment:
    """One daemon's markers: its root tag and a fresh instance id per daemon run."""

    tag: str
    instance: str = field(default_factory=lambda: secrets.token_hex(6))
    subreaper: bool = False
    cgroup: Path | None = None
    """A delegated cgroup v2 directory (or the configured one): runs get their own cgroup in it."""
    cgroup_setting: str = "auto"
    cgroup_unusable: str | None = None
    """Why the configured cgroup is not used (None: it is, or none was asked for)."""
    runs_without_cgroup: int = 0
    cgroup_error: str | None = None
    """The latest failure to give a run its cgroup."""
    swept: list[dict[str, Any]] = field(default_factory=list)
    escaped: list[dict[str, Any]] = field(default_factory=list)
    _status: tuple[tuple[object, ...], dict[str, Any]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def marker(self, record: str) -> Marker:
        return Marker(self.tag, self.instance, record)

    def run_marker(self, kind: str) -> Marker:
        """A marker for a run with no durable record of its own (a git command)."""
        return self.marker(f"{kind}-{secrets.token_hex(6)}")

    @property
    def runs(self) -> RunCgroups | None:
        if self.cgroup is None:
            return None
        return RunCgroups(self.cgroup / f"xum-{self.tag}", on_failure=self._run_without_cgroup)

    def _run_without_cgroup(self, error: str) -> None:
        self.runs_without_cgroup += 1
        self.cgroup_error = error

    @property
    def degraded(self) -> str | None:
        """Why containment is weaker than configured (None: it is not)."""
        if self.cgroup_unusable is not None:
            return (
                f"the configured cgroup {self.cgroup_setting!r} cannot be used "
                f"({self.cgroup_unusable}): runs get no cgroup; they are stopped by session or "
                "group and found by marker" + (" and the subreaper" if self.subreaper else "")
            )
        if self.runs_without_cgroup:
            return (
                f"{self.runs_without_cgroup} run(s) started without their own cgroup (latest: "
                f"{self.cgroup_error}); they are stopped by session or group and found by marker"
            )
        return None

    @property
    def mechanism(self) -> str:
        parts = ["cgroup"] if self.cgroup is not None else []
        if self.subreaper:
            parts.append("subreaper")
        parts.append("marker")
        return "+".join(parts)

    def status(self) -> dict[str, Any]:
        # Polled with every daemon.status: the model is built again only when what it shows
        # moved (`escaped` is replaced on each change, `swept` only grows).
        key = (
            self.subreaper,
            self.cgroup,
            self.instance,
            len(self.swept),
            self.escaped,
            self.cgroup_unusable,
            self.runs_without_cgroup,
        )
        if self._status is None or self._status[0] != key:
            self._status = (key, self._status_now())
        return self._status[1]

    def _status_now(self) -> dict[str, Any]:
        # The protocol's `ContainmentStatus` as its model dumps it (tests/test_containment_status
        # compares them), written out: the model's import is not on the way to readiness.
        return {
            "mechanism": self.mechanism,
            "subreaper": self.subreaper,
            "cgroup": str(self.cgroup) if self.cgroup is not None else None,
            "marker": MARKER_VAR,
            "instance": self.instance,
            "stopped_at_start": len(self.swept),
            "escaped": [dict(entry) for entry in self.escaped],
            "cgroup_setting": self.cgroup_setting,
            "degraded": self.degraded,
            "runs_without_cgroup": self.runs_without_cgroup,
        }

    async def leftovers(
        self,
        marker: Marker,
        grace_s: float,
        *,
        always: bool,
        stopped: list[Stopped] | None = None,
    ) -> list[Marked]:
        """Stop what is left of a run after its command ended: its cgroup's members (if runs get
        one), then what still carries `marker`; returns the survivors, and tells `stopped` what
        ended. Without `always`, the /proc scan runs only when it can find something: with the
        subreaper, every leftover tree hangs off an adopted orphan of the daemon."""
        left: list[Marked] = []
        runs = self.runs
        if runs is not None:
            pids = await runs.stop(marker.record, grace_s, stopped=stopped)
            left += [Marked(pid, marker, _start(pid), argv_of(pid)) for pid in pids]
        if not always and self.subreaper and not self._adopted_carry(marker.record):
            self._escaped(left)
            return left
        # By record only: an adopted process's marker names the daemon instance that started it.
        try:
            found = scan(self.tag, lambda m: m.record == marker.record)
        except OSError as exc:
            # Fail closed: a run whose leftovers could not be looked for is not clean.
            log.error("containment.scan_failed", marker=str(marker), error=str(exc))
            left.append(Marked(0, marker, None, (f"(cannot look in /proc: {exc.strerror})",)))
            found = []
        if found:
            log.warning("containment.leftovers", marker=str(marker), pids=[m.pid for m in found])
            left += await stop_marked(found, grace_s, stopped=stopped)
        self._escaped(left)
        return left

    def _adopted_carry(self, record: str) -> bool:
        """Whether an adopted orphan carries `record`. With the subreaper, the topmost live
        leftover of a run is such an orphan (its parents ended), so the whole-/proc scan is
        needed only then: a long-lived orphan of another run (an agent a hook started) no longer
        costs every git call a scan. Could not look: True (the scan then fails closed)."""
        try:
            for pid in foreign_children():
                found = read_marker(pid)
                if found is not None and found.tag == self.tag and found.record == record:
                    return True
        except OSError:
            return True
        return False

    async def sweep(self, keep: Callable[[Marker], bool], grace_s: float) -> list[Marked]:
        """At start-up, before anything is reconciled: stop what a previous daemon instance of
        this root left running (its scripts' and commands' leftovers, by cgroup and by marker),
        except what `keep` says belongs to a live supervised process (adopted). Returns what
        could not be stopped."""
        left: list[Marked] = []
        runs = self.runs
        if runs is not None:
            for record in runs.records():
                marker = Marker(self.tag, "previous", record)
                if keep(marker):
                    continue
                members = runs.members(runs.directory(record))
                self.swept += [
                    {"pid": pid, "cgroup": record, "argv": list(argv_of(pid))} for pid in members
                ]
                pids = await runs.stop(record, grace_s)
                left += [Marked(pid, marker, _start(pid), argv_of(pid)) for pid in pids]
        try:
            found = scan(self.tag, lambda m: m.instance != self.instance and not keep(m))
        except OSError as exc:
            # The daemon still starts (each run's own stop still works); said loudly.
            log.error("containment.sweep_failed", error=str(exc))
            found = []
        if found:
            counted = {entry["pid"] for entry in self.swept}
            self.swept += [m.describe() for m in found if m.pid not in counted]
            log.warning("containment.sweep", count=len(found), pids=[m.pid for m in found])
            left += await stop_marked(found, grace_s)
        self._escaped(left)
        return left

    async def still_running(self, escaped: list[Marked], grace_s: float) -> list[Marked]:
        """Those of an earlier run's escapees that still run after another stop attempt (the
        same process: marker and start time, through a pidfd)."""
        left = await stop_marked(escaped, grace_s)
        self._escaped(left)
        return left

    def _escaped(self, left: list[Marked]) -> None:
        # Bounded: the newest ones are what a user looking at daemon.status needs.
        self.escaped = [*self.escaped, *(m.describe() for m in left)][-ESCAPED_KEPT:]
