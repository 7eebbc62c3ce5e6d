"""The CLI's standard streams when the caller closed one or stopped reading.

- A standard stream closed by the caller (`xum status >&-`, `2>&-`, a hook spawned without
  them): Python leaves `sys.stdout` (or `stdin`, `stderr`) `None`, and every `isatty()` or
  `write` on it would be a traceback. The caller asked for no output, so the stream is opened
  on /dev/null and the command runs as with `>/dev/null`: its exit code is its own. The free
  descriptor is taken too, so that nothing the command opens later (the daemon's socket, a
  file) lands on 0, 1 or 2 where a child, or a stray write, would take it for a stream.
- The reader of the output went away (`xum ws ls | head -1`): the write fails with EPIPE
  (Python ignores SIGPIPE). The command ends at once, silently, with 141, the status of a
  command killed by SIGPIPE, which is what `pipefail` scripts see from any other tool there.
- The output cannot be written otherwise (a full disk, a quota, EIO: `xum ws ls > /dev/full`):
  one line on stderr naming why, exit 1. Told apart from any other OSError (a bug, raised as
  it is) by the stream itself: stdout's writes go through `_Output`, which marks its failures.

Light (no click): the fast entry (`xum_client.entry`) uses it.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Callable
from typing import Any

EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: the reader of the output went away; nothing more was written."""

EXIT_OUTPUT_FAILED = 1
"""The output could not be written (not a gone reader): an error, said on stderr."""

_STREAMS = ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w"))


_REPLACED: list[io.TextIOWrapper] = []


class OutputError(OSError):
    """A write to stdout that failed for another reason than a gone reader."""


class _Output(io.FileIO):
    """stdout's descriptor, whose failed writes say that they are the output's."""

    def write(self, b: Any, /) -> int:
        try:
            return super().write(b)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(exc.errno, f"cannot write the output: {exc.strerror}") from exc


def mark_output() -> None:
    """Route stdout's writes through `_Output`: same descriptor, encoding and buffering
    (unbuffered under PYTHONUNBUFFERED, as Python's own stdout then is)."""
    out = sys.stdout
    if not isinstance(out, io.TextIOWrapper):
        return  # not the interpreter's stream (a test's capture): leave it
    below = out.buffer
    raw = getattr(below, "raw", below)
    if isinstance(raw, _Output) or not isinstance(raw, io.FileIO):
        return
    out.flush()
    # The stream replaced may own its descriptor (a mended /dev/null): kept alive, so that no
    # collection closes what `_Output` writes to.
    _REPLACED.append(out)
    output = _Output(raw.fileno(), "w", closefd=False)
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(output) if below is not raw else output,
        encoding=out.encoding,
        errors=out.errors,
        line_buffering=out.line_buffering,
        write_through=out.write_through,
    )


def prepare() -> None:
    """What both entries do first: closed streams mended, the output's failures marked."""
    mend_closed_streams()
    mark_output()


def mend_closed_streams() -> None:
    """Open /dev/null for each standard stream the caller closed (see the module's text)."""
    for fd, name, mode in _STREAMS:
        if getattr(sys, name) is not None:
            continue
        try:
            os.fstat(fd)
        except OSError:
            # Free: put /dev/null on it (the lowest free descriptor; dup2 in case it is not).
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            setattr(sys, name, open(fd, mode, encoding="utf-8", closefd=False))  # noqa: SIM115
        else:
            # Taken meanwhile by something else: never write into that, only into /dev/null.
            setattr(sys, name, open(os.devnull, mode, encoding="utf-8"))  # noqa: SIM115


class OutputGone(Exception):
    """A broken pipe carried past click, which would exit 1 on its own (`XumGroup.invoke`)."""


def _reader_gone(fd: int) -> bool:
    """Whether `fd` is a pipe or socket whose other end is closed (poll reports an error)."""
    import select

    poller = select.poll()
    poller.register(fd, 0)
    try:
        return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))
    except OSError:
        return False


def run_guarded(command: Callable[[], None]) -> None:
    """Run `command` (a CLI's main), flush its output, and turn a reader that went away into
    exit 141 without a traceback. A broken pipe that is not the output's (a bug elsewhere)
    is raised as it is."""
    try:
        try:
            command()
        finally:
            # A small output sits in the buffer until here: write it while a failure can still
            # be told apart, not in the interpreter's exit (which prints "Exception ignored").
            for stream in (sys.stdout, sys.stderr):
                if stream is not None:
                    stream.flush()
    except OutputError as exc:
        _silence()
        if sys.stderr is not None:
            with contextlib.suppress(OSError):
                sys.stderr.write(f"xum: {exc.strerror}\n")
                sys.stderr.flush()
        sys.exit(EXIT_OUTPUT_FAILED)
    except (BrokenPipeError, OutputGone) as exc:
        if not (_reader_gone(1) or _reader_gone(2)):
            if isinstance(exc, OutputGone) and exc.__cause__ is not None:
                raise exc.__cause__ from None
            raise
        _silence(1, 2)
        sys.exit(EXIT_BROKEN_PIPE)


def _silence(*fds: int) -> None:
    """Point `fds` (default: stdout) at /dev/null: what is still buffered can go nowhere, and
    the interpreter's own last flush then finds nothing to complain about."""
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in fds or (1,):
        os.dup2(null, fd)
    os.close(null)
