"""Talking to a supervised process: its output, its input, its terminal size, signals, its exit.

Input goes to the pipe or PTY master the daemon holds, or, for a process that may outlive the
daemon, to its durable stdin FIFO (durable.py); such a stdin never ends, so `eof` is refused.
Every wait is bounded: a process that does not read its input makes a write time out.
"""

from __future__ import annotations

import base64
import os
import signal
from typing import Any

import anyio
from xum_protocol.errors import ErrorKind

from xumd.base.errors import XumError
from xumd.processes.managed import Managed
from xumd.processes.output_log import OutputLog
from xumd.processes.spawn import Child, set_winsize

WRITE_TIMEOUT_S = 10.0


def parse_signal(name: str) -> signal.Signals:
    key = name.strip().upper()
    if key.isdigit():
        try:
            return signal.Signals(int(key))
        except ValueError:
            pass
    else:
        try:
            return signal.Signals[key if key.startswith("SIG") else "SIG" + key]
        except KeyError:
            pass
    raise XumError(ErrorKind.INVALID_PARAMS, f"unknown signal {name!r}", signal=name)


async def read_output(
    managed: Managed, since: int, wait_s: float, max_bytes: int, encoding: str
) -> dict[str, Any]:
    if isinstance(managed.ring, OutputLog) and not managed.ring.closed:
        managed.ring.refresh()  # what was written since the last poll, at no cost
    if wait_s > 0 and managed.ring.total <= since and managed.live_state:
        with anyio.move_on_after(wait_s):
            await managed.ring.wait_beyond(since, wait_s)
            if managed.ring.closed and managed.live_state:
                # Output ended: the exit follows at once (or the probe settles it).
                with anyio.move_on_after(max(0.0, wait_s)):
                    await managed.exited.wait()
    chunk = managed.ring.read(since, max_bytes)
    data = (
        base64.b64encode(chunk.data).decode()
        if encoding == "base64"
        else chunk.data.decode(errors="replace")
    )
    end = chunk.start + len(chunk.data)
    return {
        "data": data,
        "encoding": encoding,
        "start": chunk.start,
        "next": end,
        "dropped": chunk.dropped,
        "dropped_total": managed.ring.dropped,
        "exited": not managed.live_state and end >= managed.ring.total,
        "exit": managed.exit,
        "source": managed.output_source,
    }


def _require_child(managed: Managed, what: str) -> Child:
    if not managed.live_state:
        raise XumError(ErrorKind.INVALID_STATE, f"process {managed.id} has exited")
    if managed.child is None or managed.child.input_fd is None:
        reason = "it was adopted after a restart" if managed.adopted else "its input is closed"
        raise XumError(ErrorKind.INVALID_STATE, f"cannot {what} process {managed.id}: {reason}")
    return managed.child


def _input_fd(managed: Managed, eof: bool) -> int:
    """Where `process.write` goes: the durable stdin FIFO, or the pipe / PTY master."""
    if managed.io is None:
        fd = _require_child(managed, "write to").input_fd
        assert fd is not None  # checked by _require_child
        return fd
    if not managed.live_state:
        raise XumError(ErrorKind.INVALID_STATE, f"process {managed.id} has exited")
    if eof:
        raise XumError(
            ErrorKind.INVALID_STATE,
            f"the stdin of process {managed.id} cannot be closed: it may outlive the daemon, "
            "so it reads a FIFO it holds open itself (it never ends); end the input in-band, "
            "or stop the process",
            process_id=managed.id,
        )
    try:
        return managed.io.writer()
    except OSError as exc:
        raise XumError(
            ErrorKind.INVALID_STATE,
            f"process {managed.id} no longer reads its input: {exc.strerror or exc}",
        ) from None


async def write_input(managed: Managed, data: bytes, eof: bool) -> int:
    fd = _input_fd(managed, eof)
    view = memoryview(data)
    written = 0
    with anyio.move_on_after(WRITE_TIMEOUT_S) as scope:
        while written < len(view):
            try:
                written += os.write(fd, view[written:])
            except BlockingIOError:
                await anyio.wait_writable(fd)
            except OSError as exc:
                raise XumError(
                    ErrorKind.INVALID_STATE,
                    f"process {managed.id} input closed: {exc.strerror}",
                ) from None
    if scope.cancelled_caught:
        raise XumError(
            ErrorKind.TIMEOUT,
            f"timed out writing to process {managed.id} (it does not read its input)",
            waited_for="process input",
            written=written,
        )
    if eof:
        child = managed.child
        assert child is not None  # durable stdin refused eof above
        if child.pty:
            os.write(fd, b"\x04")
        else:
            child.close_input()
    return written


def resize(managed: Managed, cols: int, rows: int) -> None:
    if not managed.pty:
        raise XumError(ErrorKind.INVALID_STATE, f"process {managed.id} has no PTY")
    child = _require_child(managed, "resize")
    assert child.input_fd is not None  # checked by _require_child
    # The kernel sends SIGWINCH to the terminal's foreground process group itself.
    set_winsize(child.input_fd, cols, rows)


def send_signal(managed: Managed, sig: signal.Signals) -> None:
    if not managed.live_state or not managed.pgid:
        raise XumError(ErrorKind.INVALID_STATE, f"process {managed.id} has exited")
    try:
        os.killpg(managed.pgid, sig)
    except ProcessLookupError:
        raise XumError(ErrorKind.INVALID_STATE, f"process {managed.id} is gone") from None


async def wait_exited(managed: Managed, timeout_s: float) -> Managed:
    with anyio.move_on_after(timeout_s):
        await managed.exited.wait()
    if managed.live_state:
        raise XumError(
            ErrorKind.TIMEOUT,
            f"process {managed.id} still {managed.state} after {timeout_s}s",
            waited_for=f"exit of {managed.id}",
            state=managed.state,
        )
    return managed
