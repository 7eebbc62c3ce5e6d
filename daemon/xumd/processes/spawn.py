"""Starting one supervised child: own session, pipes or a PTY, and a start gate.

The start gate closes the spawn-to-record crash window: the child is started as a tiny Python
shim that waits on a pipe before it execs the real program. The daemon records the child's pid,
pgid and start time in its lease (durable) and only then opens the gate. If the daemon dies in
between, the pipe's write end closes, the shim reads EOF and exits without running anything, so
no program ever runs without a durable record. exec keeps the pid and the start time.

The shim hands the program every signal at its default and none blocked, and the descriptor
soft limit the daemon started with (`containment.shim_prologue` says why).

For a PTY the shim also makes the terminal its controlling terminal (TIOCSCTTY; it leads a new
session), so the program gets job control (^C, ^Z). The shim is a separate program rather than a
pre-exec hook: running Python code in a forked child of a threaded daemon is not safe.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import struct
import subprocess
import sys
import termios
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from xumd.system import containment

_SHIM = """
import fcntl, os, sys, termios
gate, tty = int(sys.argv[1]), sys.argv[2]
try:
    go = os.read(gate, 3) == b"go\\n"
except OSError:
    go = False
if not go:
    os._exit(125)  # the gate closed without a go: the program never runs
os.close(gate)
if tty:
    try:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    except OSError:
        pass
try:
    os.execvp(sys.argv[3], sys.argv[3:])
except OSError as exc:
    sys.stderr.write(f"xum: cannot run {sys.argv[3]}: {exc.strerror}\\n")
    os._exit(127)
"""


class ProgramNotFound(Exception):
    pass


def resolve_program(argv0: str, *, path_env: str | None, cwd: Path) -> str:
    """Where argv[0] is, or ProgramNotFound: a missing program is refused before anything
    is written or started (the shim would only report it as exit 127 later)."""
    if not argv0 or "\0" in argv0:
        raise ProgramNotFound("argv[0] is empty")
    if "/" in argv0:
        candidate = Path(argv0) if os.path.isabs(argv0) else cwd / argv0
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
        raise ProgramNotFound(f"{argv0}: no such executable file")
    found = shutil.which(argv0, path=path_env)
    if found is None:
        raise ProgramNotFound(f"{argv0}: command not found in PATH")
    return found


def _shim(gate_fd: int, tty: str) -> list[str]:
    code = containment.shim_prologue() + _SHIM
    return [sys.executable, "-I", "-S", "-c", code, str(gate_fd), tty]


def set_winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _nonblocking(fd: int) -> None:
    os.set_blocking(fd, False)


@dataclass
class Child:
    popen: subprocess.Popen[bytes]
    output_fd: int | None
    """The read end of its output pipe or the PTY master; None: it writes to a durable file."""
    input_fd: int | None
    gate_fd: int | None
    pty: bool

    @property
    def pid(self) -> int:
        return self.popen.pid

    def open_gate(self) -> None:
        """Let the shim exec the program (call after the lease has the pid)."""
        if self.gate_fd is None:
            return
        try:
            os.write(self.gate_fd, b"go\n")
        finally:
            self.close_gate()

    def close_gate(self) -> None:
        """Without a go first: the shim exits 125 and the program never runs."""
        if self.gate_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.gate_fd)
            self.gate_fd = None

    def close_input(self) -> None:
        if self.input_fd is not None and self.input_fd != self.output_fd:
            with contextlib.suppress(OSError):
                os.close(self.input_fd)
        if not self.pty:
            self.input_fd = None

    def close_all(self) -> None:
        self.close_gate()
        self.close_input()
        if self.output_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.output_fd)
        self.output_fd = None
        self.input_fd = None


def start_child(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    pty: bool,
    cols: int = 80,
    rows: int = 24,
    stdio: tuple[int, int] | None = None,
) -> Child:
    """Start the gated shim in a new session; the program runs once `open_gate()` is called.

    `stdio`: (stdin, stdout) descriptors the child gets instead of pipes to the daemon (a durable
    FIFO and output file, see durable.py); the caller keeps ownership and closes them after."""
    gate_r, gate_w = os.pipe()
    parent_fds: list[int] = []
    child_fds: list[int] = [gate_r]
    output_fd: int | None
    input_fd: int | None
    try:
        if stdio is not None:
            args = [*_shim(gate_r, ""), *argv]
            stdin, stdout = stdio
            output_fd = input_fd = None
        elif pty:
            master, slave = os.openpty()
            parent_fds.append(master)
            child_fds.append(slave)
            set_winsize(master, cols, rows)
            args = [*_shim(gate_r, "tty"), *argv]
            stdin = stdout = slave
            output_fd, input_fd = master, master
        else:
            in_r, in_w = os.pipe()
            out_r, out_w = os.pipe()
            parent_fds += [in_w, out_r]
            child_fds += [in_r, out_w]
            args = [*_shim(gate_r, ""), *argv]
            stdin, stdout = in_r, out_w
            output_fd, input_fd = out_r, in_w
        popen = subprocess.Popen(  # noqa: S603 - argv, no shell interpolation of user input
            args,
            cwd=cwd,
            env=dict(env),
            stdin=stdin,
            stdout=stdout,
            stderr=stdout,
            start_new_session=True,
            pass_fds=(gate_r,),
            close_fds=True,
        )
        # No await since the fork: the orphan reaper cannot have run; it never reaps this one.
        containment.register(popen.pid)
    except BaseException:
        for fd in (gate_w, *parent_fds):
            with contextlib.suppress(OSError):
                os.close(fd)
        raise
    finally:
        for fd in child_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
    for own in (output_fd, input_fd):
        if own is not None:
            _nonblocking(own)
    return Child(popen, output_fd, input_fd, gate_w, pty)
