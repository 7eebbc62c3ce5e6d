"""A child process started straight from the event loop's thread and awaited through a pidfd.

`procutil.run_command` used `anyio.open_process` (asyncio's subprocess transport): each child
also started a waiter thread (asyncio's threaded child watcher) and went through the transport's
protocol callbacks, and `start_new_session` is a new session per child. On this project's
machine the two cost ~7 ms per git call over a bare `subprocess.run` (docs/PERFORMANCE.md,
"Create and remove"): `setsid()` alone is 4-10 ms under load, because with the
kernel's scheduler autogroups (`/proc/sys/kernel/sched_autogroup_enabled`) every new session
creates a scheduling group, and the parent waits for it (vfork: until the child's exec).

Here a child is a plain `subprocess.Popen` (vfork + exec, as asyncio does inside), its pipes
are read and written through `anyio.wait_readable`/`wait_writable` on their descriptors, and its
exit is a readable pidfd (one wake-up, no thread). Where pidfds are missing (non-Linux, a
kernel before 5.3) the exit is polled, briefly at first.

`own_session=False` puts the child in a new process group of the daemon's session instead of a
session of its own: the group is still the child's alone (what the tree kill signals), and it
is exactly equivalent when the daemon has no controlling terminal (a daemon under systemd, or
started by `xum daemon start`): a child that is not a session leader cannot acquire one, so
`/dev/tty` fails for it as it would in its own session. The caller asks for it only then
(`has_controlling_tty`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import IO

import anyio

from xumd.system.platform import current

READ_SIZE = 65536  # pragma: no mutate (every chunk is read to end of file)
_POLL_FIRST_S = 0.001  # pragma: no mutate (latency only)
_POLL_MAX_S = 0.05  # pragma: no mutate (latency only)


def has_controlling_tty() -> bool:
    """True when this process has a controlling terminal (opening /dev/tty works)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    return True


class _Pipe:
    """One end of a child's pipe (the Popen's file object, used by descriptor), non-blocking."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self.fd = file.fileno()
        os.set_blocking(self.fd, False)

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()


class FdReceive(_Pipe):
    """The read end: iterates chunks until end of file."""

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        while True:
            try:
                chunk = os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                await anyio.wait_readable(self.fd)
                continue
            if not chunk:
                return
            yield chunk


class FdSend(_Pipe):
    """The write end (the child's stdin)."""

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.fd, view)
            except BlockingIOError:
                await anyio.wait_writable(self.fd)
                continue
            view = view[written:]


class Child:
    """A started child: `pid`, `returncode` once waited for, `stdout` (stderr merged into it)
    and `stdin` (a pipe only when asked for)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdout = FdReceive(popen.stdout) if popen.stdout is not None else None
        self.stdin = FdSend(popen.stdin) if popen.stdin is not None else None
        self._pidfd: int | None
        try:
            self._pidfd = current().pidfd_open(self.pid)
        except OSError:
            self._pidfd = None

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def wait(self) -> int:
        """Wait for the exit (cancellable) and reap it."""
        if self._popen.returncode is not None:
            return self._popen.returncode
        if self._pidfd is not None:
            await anyio.wait_readable(self._pidfd)
            return self._popen.wait()  # a zombie now: reaped at once
        delay = _POLL_FIRST_S
        while (code := self._popen.poll()) is None:
            await anyio.sleep(delay)
            # Not mutated: how often an exit is polled, not its result.
            delay = min(delay * 2, _POLL_MAX_S)  # pragma: no mutate
        return code

    def close(self) -> None:
        """Our descriptors (pipes and pidfd), now rather than at garbage collection."""
        for stream in (self.stdin, self.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if self._pidfd is not None:
            fd, self._pidfd = self._pidfd, None
            with contextlib.suppress(OSError):
                os.close(fd)


def start(
    argv: Sequence[str],
    *,
    cwd: Path | str | None,
    env: Mapping[str, str] | None,
    stdin_pipe: bool,
    own_session: bool = True,
    stderr_fd: int | None = None,
) -> Child:
    """Start argv with stdout and stderr merged into one pipe (or stderr to `stderr_fd`, for
    a listing whose diagnostics must never read as entries); raises what Popen raises."""
    popen = subprocess.Popen(  # noqa: S603 - argv only, never a shell (procutil)
        list(argv),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if stderr_fd is None else stderr_fd,
        start_new_session=own_session,
        process_group=None if own_session else 0,
    )
    return Child(popen)
