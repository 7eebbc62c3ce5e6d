"""Child processes: own process group, bounded output, deadlines, whole-tree kill.

Every child the daemon starts (git, setup/teardown scripts, supervised processes) goes through
here, so the rules hold everywhere: argv only (never a shell unless the caller passes `sh -c`
explicitly for a trusted script), a new session (or a new group: `own_session`,
xumd.system.childproc) so the child and its descendants form one group, a program that cannot run
named as such whatever wraps it, a deadline on every wait, and SIGTERM-then-SIGKILL of the whole
tree. Who a process is (pid and start time) is `xumd.system.procstat`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from xumd.base import logs
from xumd.system import childproc, fdlimits, procstat
from xumd.system import containment as contain
from xumd.system.platform import current

if TYPE_CHECKING:  # loaded at first use (an idle daemon never loads it)
    import psutil

log = logs.get("xumd.proc")

DEFAULT_OUTPUT_LIMIT = 64 * 1024

# A command the daemon runs must not outlive a crashed daemon: a git left running after a SIGKILL
# could finish `worktree add` after the next daemon's recovery pass looked at the disk. On Linux,
# util-linux's setpriv sets the parent-death signal (kept across exec) with one extra exec; SIGTERM
# lets git remove its own lock files. Where setpriv is missing, commands run without it.
_SETPRIV = current().tool("setpriv")
_SETPRIV_REAL = os.path.realpath(_SETPRIV) if _SETPRIV else None
# A child starts with the descriptor soft limit the daemon started with, not the one the daemon
# raised for itself (fdlimits.child_soft says why). A wrapper that sets it and execs, not a
# pre-exec hook (Python in a forked child of a threaded daemon is not safe), and not a
# prlimit(2) on the pid after the start (the command could fork a hook before it lands).
_PRLIMIT = current().tool("prlimit")


# -- liveness of groups and trees ------------------------------------------------------------


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists (kill(-pgid, 0) does not say ESRCH)."""
    if pgid <= 1:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg(…, 0) also counts zombies; a group of zombies only is not alive.
    import psutil  # at first use: an idle daemon never loads it (docs/PERFORMANCE.md)

    return any(_live_member(p, pgid) for p in psutil.process_iter(["pid"]))


def _live_member(proc: psutil.Process, pgid: int) -> bool:
    import psutil

    try:
        return os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE
    except (OSError, psutil.Error):
        return False


# -- killing ---------------------------------------------------------------------------------


def _signal_pids(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal the group (never the daemon's own); True when it was sent."""
    if pgid > 1 and pgid != os.getpgrp():
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    return False


async def kill_tree(
    pid: int,
    pgid: int | None,
    grace_s: float,
    *,
    poll_s: float = 0.02,  # pragma: no mutate (the deadlines are unchanged: latency only)
    stopped: list[contain.Stopped] | None = None,
) -> bool:
    """SIGTERM the group and the tree (each once), wait up to `grace_s`, then SIGKILL every member.

    Descendants are collected before signalling, so a child that escaped the group (setsid)
    is still reached when it was a descendant at that moment. Each is known by pid *and* start
    time: one that ended during the grace and whose pid was handed to another process (pids
    wrap: 32768 by default) is not signalled nor waited for. Returns True when nothing of the
    tree or the group is left. `stopped` is told each process other than `pid` itself (what
    the run left behind) that ended, with the signal that ended it.
    """
    members = _identified(pid, {})
    behind = _left_behind(pid, pgid, members) if stopped is not None else {}
    signalled = pgid if pgid and _signal_group(pgid, signal.SIGTERM) else None
    # Once each: a second SIGTERM is `quit now, skip the clean-up` to many programs.
    _signal_pids(
        sorted(p for p in members if not signalled or _pgid(p) != signalled), signal.SIGTERM
    )
    killed: set[int] = set()
    try:
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            members = _identified(pid, members)
            if not _any_alive(members) and not (pgid and group_alive(pgid)):
                return True
            await anyio.sleep(poll_s)
        members = _identified(pid, members)
        killed = {p for p, (start, _argv) in behind.items() if _still(p, start)}
        if pgid:
            _signal_group(pgid, signal.SIGKILL)
        _signal_pids(sorted(p for p, start in members.items() if _still(p, start)), signal.SIGKILL)
        # SIGKILL cannot be ignored; give the kernel a moment to reap, bounded.
        # Not mutated: a tree SIGKILL can end is gone in ms: latency only.
        with anyio.move_on_after(2.0):  # pragma: no mutate
            while _any_alive(members) or (pgid and group_alive(pgid)):
                await anyio.sleep(poll_s)
            return True
        log.warning("proc.tree_survived_sigkill", pid=pid, pgid=pgid)
        return False
    finally:
        if stopped is not None:
            contain.add_stopped(
                stopped,
                (
                    contain.Stopped.of(p, start, argv, p in killed)
                    for p, (start, argv) in behind.items()
                    if not _still(p, start)
                ),
            )


def _left_behind(
    pid: int, pgid: int | None, tree: dict[int, float | None]
) -> dict[int, tuple[float | None, tuple[str, ...]]]:
    """The group's and the tree's members but `pid` itself, each with its start time and its
    command (read now: a process that ended has none)."""
    found = {p: start for p, start in tree.items() if p != pid}
    if pgid and pgid > 1:
        import psutil

        for proc in psutil.process_iter(["pid"]):
            if proc.pid != pid and proc.pid not in found and _live_member(proc, pgid):
                found[proc.pid] = procstat.start_time(proc.pid)
    return {p: (start, contain.argv_of(p)) for p, start in found.items()}


def _identified(root: int, known: dict[int, float | None]) -> dict[int, float | None]:
    """`known` (pid -> start time) with the tree's current members, each (re)identified now:
    a pid in the tree now is the tree's, whatever ran under it before. Parent and start time
    come from one read (`procstat.tree_identities`): a member that ends between listing and
    identifying cannot make the stranger that took its pid a member."""
    return {**known, **procstat.tree_identities(root)}


def _still(pid: int, start: float | None) -> bool:
    """The process identified as (pid, start) still runs (a zombie does not; a pid reused by
    another process is not it)."""
    found = procstat.identity(pid)
    if found is None:
        return False
    started, zombie = found
    return not zombie and (start is None or abs(started - start) < procstat.START_TOLERANCE_S)


def _any_alive(members: dict[int, float | None]) -> bool:
    return any(_still(p, start) for p, start in members.items())


# -- bounded output ----------------------------------------------------------------------------


@dataclass
class BoundedOutput:
    """Keeps the head and the diagnostic tail of a stream, and counts what fell between."""

    limit: int = DEFAULT_OUTPUT_LIMIT
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    dropped: int = 0

    def feed(self, data: bytes) -> None:
        half = self.limit // 2
        room = half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        excess = len(self.tail) - (self.limit - half)
        if excess > 0:
            del self.tail[:excess]
            self.dropped += excess

    def text(self) -> str:
        middle = f"\n[... {self.dropped} bytes dropped ...]\n" if self.dropped else ""
        return (
            bytes(self.head).decode(errors="replace")
            + middle
            + bytes(self.tail).decode(errors="replace")
        )

    def tail_text(self, size: int = 2048) -> str:
        joined = bytes(self.head + self.tail) if not self.dropped else bytes(self.tail)
        return joined[-size:].decode(errors="replace")


# -- running commands --------------------------------------------------------------------------


@dataclass
class CommandResult:
    argv: list[str]
    returncode: int | None
    output: BoundedOutput
    timed_out: bool
    duration_s: float
    pid: int = 0
    escaped: list[contain.Marked] = field(default_factory=list)
    """Descendants of the run (its marker, its cgroup) still alive after SIGKILL."""
    stopped: list[contain.Stopped] = field(default_factory=list)
    """What the command left behind and was stopped once it ended (after a timeout or a
    cancellation the whole tree is stopped, and nothing is listed here)."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def describe(self) -> str:
        if self.timed_out:
            return f"{self.argv[0]} timed out after {self.duration_s:.1f}s"
        if self.returncode is not None and self.returncode < 0:
            return f"{self.argv[0]} killed by signal {-self.returncode}"
        return f"{self.argv[0]} exited with {self.returncode}"


async def _feed_stdin(stream: childproc.FdSend, data: bytes) -> None:
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await stream.send(data)
    with contextlib.suppress(OSError):
        await stream.aclose()


async def _read_into(
    stream: childproc.FdReceive | None,
    output: BoundedOutput,
    scope: anyio.CancelScope,
    done: anyio.Event,
    on_output: Callable[[bytes], None] | None = None,
) -> None:
    try:
        if stream is None:
            return
        with scope:
            try:
                async for chunk in stream:
                    output.feed(chunk)
                    if on_output is not None:
                        on_output(chunk)  # e.g. setup progress events; must not raise
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass
    finally:
        done.set()


def _resolve_program(argv0: str, env: Mapping[str, str] | None, cwd: Path | str | None) -> str:
    """The program argv0 names, checked before any wrapper (setpriv, the cgroup join) execs it:
    a wrapper that fails to exec it exits 127/126 like any command, which would read as the
    command's own failure. Raises the CommandNotFound the bare exec would have raised."""
    if cwd is not None and not os.path.isdir(cwd):
        return argv0  # the start fails on the directory first, and says so

    def in_cwd(path: str) -> str:
        # The exec runs in the child, after its chdir: what is relative is relative to `cwd`
        # (without one, to the daemon's own, which the child inherits: left relative, so a
        # daemon whose directory was deleted still gets an answer).
        return os.path.join(cwd, path) if cwd is not None else path

    if os.sep not in argv0:
        path = (os.environ if env is None else env).get("PATH", os.defpath)
        found = shutil.which(argv0, path=os.pathsep.join(map(in_cwd, path.split(os.pathsep))))
        if found is None:
            raise CommandNotFound(f"{argv0}: command not found")
        return found
    program = in_cwd(argv0)
    if not os.path.exists(program):
        raise CommandNotFound(f"{argv0}: command not found")
    if os.path.isdir(program) or not os.access(program, os.X_OK):
        raise CommandNotFound(f"{argv0}: {os.strerror(errno.EACCES)}")
    return argv0


def _with_child_limit(argv: list[str]) -> list[str]:
    """argv (its program resolved) wrapped so that it starts with the daemon's initial
    descriptor soft limit, when the daemon raised its own (only the soft limit: `N:`)."""
    soft = fdlimits.child_soft()
    if soft is None:
        return argv
    if _PRLIMIT is None:
        _warn_unrestored(soft)
        return argv
    return [_PRLIMIT, f"--nofile={soft}:", "--", *argv]


@functools.cache
def _warn_unrestored(soft: int) -> None:
    # Once: every command would say the same.
    log.warning("fd.child_limit_not_restored", soft=soft, reason="prlimit (util-linux) not found")


def _with_parent_death_signal(argv: Sequence[str], program: str) -> list[str]:
    """argv (its program resolved) wrapped so that the child gets SIGTERM if the daemon dies."""
    if _SETPRIV is None:
        return list(argv)
    return [_SETPRIV, "--pdeathsig", "TERM", "--", program, *argv[1:]]


PDEATHSIG_WAIT_S = 1.0


def _runs_setpriv(pid: int) -> bool:
    """True while the process still runs setpriv's image (an ended one: False)."""
    return current().exe(pid) == _SETPRIV_REAL


class CommandNotFound(Exception):
    pass


async def run_command(
    argv: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float,
    grace_s: float = 5.0,  # pragma: no mutate (every caller passes its own grace)
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    stdin: bytes | None = None,
    on_start: object = None,
    on_output: Callable[[bytes], None] | None = None,
    containment: contain.Containment | None = None,
    marker: contain.Marker | None = None,
    own_session: bool = True,
    stderr_fd: int | None = None,
) -> CommandResult:
    """Run argv in its own session with merged stdout/stderr, bounded output and a deadline.
    `stderr_fd`: stderr goes there instead (the output is then stdout alone).

    On timeout or cancellation the whole tree gets SIGTERM, then SIGKILL after `grace_s`;
    cancellation is re-raised after the tree is gone (shielded, bounded). With `containment`,
    the child carries a marker (`marker`, or a fresh one) in its environment, and whatever still
    carries it once the command ended (a double-forked descendant too) is stopped as well.
    `own_session=False`: a new process group instead of a new session (cheaper; see
    `xumd.system.childproc`), for callers that checked the daemon has no controlling terminal.
    """
    if not argv:
        raise ValueError("empty argv")
    started = time.monotonic()
    output = BoundedOutput(output_limit)
    explicit = marker is not None
    if containment is not None:
        marker = marker or containment.run_marker("cmd")
    if marker is not None:
        env = {**(os.environ if env is None else env), contain.MARKER_VAR: str(marker)}
    program = _resolve_program(argv[0], env, cwd)
    runs = containment.runs if containment is not None else None
    full_argv: list[str] | None = None
    if runs is not None and marker is not None:
        # Its own cgroup: whatever it starts stays inside, even with a fresh environment. The
        # join's shim also puts the descriptor limit back (containment.shim_prologue).
        plain = _with_parent_death_signal(argv, program)
        joined = runs.join_argv(marker.record, plain)
        full_argv = joined if joined != plain else None  # no cgroup after all: as below
    if full_argv is None:
        # Inside setpriv: the start's wait for setpriv's exec still proves pdeathsig is set.
        limited = _with_child_limit([program, *argv[1:]])
        full_argv = _with_parent_death_signal(limited, limited[0])
    contain.starting()
    pid: int | None = None
    try:
        # Synchronous (vfork + exec, no await): no cancellation can land between the fork and
        # the handle; a pending one is taken at the next await, which kills the tree.
        proc = childproc.start(
            full_argv,
            cwd=cwd,
            env=env,
            stdin_pipe=stdin is not None,
            own_session=own_session,
            stderr_fd=stderr_fd,
        )
        pid = proc.pid
    except FileNotFoundError as exc:
        if cwd is not None and not os.path.isdir(cwd):
            # The program may well exist: it is where it would run that is gone.
            raise CommandNotFound(f"{argv[0]}: no working directory {cwd}") from exc
        raise CommandNotFound(f"{argv[0]}: command not found") from exc
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EACCES, errno.ENOTDIR):
            raise CommandNotFound(f"{argv[0]}: {exc.strerror}") from exc
        raise
    finally:
        # Registered before the orphan reaper can run again: it never reaps this child.
        contain.started(pid)
    timed_out = False  # pragma: no mutate (never read: set right after the deadline block)
    try:
        if callable(on_start):
            # Whoever records the pid (a lease) relies on the parent-death signal from then
            # on: wait, boundedly, until setpriv has set it and exec'd the command (the start
            # returns at setpriv's exec, before its prctl). Inside the `try`: a cancellation
            # in this wait stops the child like one at any later await.
            with anyio.move_on_after(PDEATHSIG_WAIT_S):
                while full_argv[0] == _SETPRIV and _runs_setpriv(proc.pid):
                    await anyio.sleep(0.001)
            on_start(proc.pid)
        with anyio.move_on_after(timeout_s) as scope:
            async with anyio.create_task_group() as tg:
                if stdin is not None and proc.stdin is not None:
                    tg.start_soon(_feed_stdin, proc.stdin, stdin)
                reader, read_all = anyio.CancelScope(), anyio.Event()
                tg.start_soon(_read_into, proc.stdout, output, reader, read_all, on_output)
                await proc.wait()
                # A descendant may still hold the pipe open: read what is buffered, briefly.
                with anyio.move_on_after(0.5):
                    await read_all.wait()
                reader.cancel()
        timed_out = scope.cancelled_caught
    finally:
        # The command's process group does not outlive the command: leftovers (a background
        # job a script forgot, or the whole tree on timeout/cancel) are stopped, bounded.
        # What a command that ended on its own left is told (its result's `stopped`).
        stopped: list[contain.Stopped] | None = [] if proc.returncode is not None else None
        if proc.returncode is None or group_alive(proc.pid):
            with anyio.CancelScope(shield=True):
                await kill_tree(proc.pid, proc.pid, grace_s, stopped=stopped)
                # Not mutated: kill_tree already waited: latency only.
                with anyio.move_on_after(2.0):  # pragma: no mutate
                    await proc.wait()
        if proc.returncode is not None:
            contain.waited(proc.pid)
        escaped: list[contain.Marked] = []
        # Shielded: on cancellation (a shutdown) this is exactly when leftovers must go.
        with anyio.CancelScope(shield=True):
            if containment is not None and marker is not None:
                # Descendants that left the group and the tree (setsid, double fork) still
                # carry the marker: the command does not outlive the command, wherever they went.
                escaped = await containment.leftovers(
                    marker, grace_s, always=explicit, stopped=stopped
                )
            # Our ends of the pipes (and the pidfd) now, not at garbage collection: a
            # descendant that escaped may hold the other end open for as long as it lives.
            proc.close()
    return CommandResult(
        argv=list(argv),
        returncode=proc.returncode,
        output=output,
        timed_out=timed_out,
        duration_s=time.monotonic() - started,  # pragma: no mutate (the duration is only shown)
        pid=proc.pid,
        escaped=escaped,
        stopped=stopped or [],
    )
