"""The socket side of one connection: an asyncio `Protocol` over the sans-IO `FrameReader`.

asyncio calls `data_received` with whatever one read returned (one epoll registration for the
connection's life, no task woken per read); the reader cuts it into frames. A frame the
connection can answer at once (`fast`: a handler that does not await) is answered right there,
in the callback, without a task; any other frame waits in `pending` for the connection's reader
task, in order, and once one waits every later frame waits behind it.

Flow control both ways, so memory stays bounded whatever the peer does:
- input: reading pauses while the frames waiting for admission exceed `READ_PAUSE_BYTES` (the
  connection admits them as in-flight slots free up), and stops for good at the end of input,
  an oversize frame or a graceful close;
- output: `writable` is False while the transport's buffer is above `WRITE_HIGH` (asyncio's
  pause_writing / resume_writing); the connection then queues answers in its bounded outbox,
  which is where a peer that does not read is detected and dropped.

The answers to the frames of one read are joined into one write (a client that pipelines costs
one send per read, not one per answer), counted against `WRITE_HIGH` as they are joined, so the
transport's buffer is bounded as if each had been written on its own.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
from xum_protocol.framing import FrameReader

READ_PAUSE_BYTES = 256 * 1024
"""Bytes of frames received but not yet admitted before reading pauses (resumes at half)."""
WRITE_HIGH = 64 * 1024
"""The transport's own write buffer: above this the connection queues in its outbox instead."""
WRITE_LOW = 16 * 1024

LINGER_S = 0.5
LINGER_BYTES = 1024 * 1024
CLOSE_DEADLINE_S = 1.0


class FrameProtocol(asyncio.Protocol):
    def __init__(self, max_frame: int) -> None:
        self.reader = FrameReader(max_frame)
        self.pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self.transport: asyncio.Transport | None = None
        self.eof = False
        """The peer shut its sending side (or closed its socket)."""
        self.lost = False
        """The transport is closed (by either side, or an error)."""
        self.writable = True
        self.fast: Callable[[bytes], bool] | None = None
        """Answers a frame at once and says so (True), or leaves it to the reader task."""
        self._read_paused = False
        self._stopped = False
        self._discarding = False
        self._discarded = 0
        self._eof_written = False
        self._joined: list[bytes] | None = None
        """While one read's frames are answered: the answers not yet handed to the transport."""
        self._joined_bytes = 0
        self._input = asyncio.Event()
        self._output = asyncio.Event()
        self._output.set()
        self._closed = asyncio.Event()

    # -- asyncio callbacks -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(WRITE_HIGH, WRITE_LOW)

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            self._discarded += len(data)
            if self._discarded >= LINGER_BYTES:
                self._input.set()
            return
        if self._stopped:
            return
        frames = self.reader.feed(data)
        fast = self.fast
        if fast is not None and len(frames) > 1:
            # Several frames in one read (a pipelining client): their inline answers leave in
            # one write, one syscall, not one each.
            self._joined = []
        try:
            for frame in frames:
                if fast is not None and not self.pending and fast(frame):
                    continue
                self.pending.append(frame)
                self._pending_bytes += len(frame)
        finally:
            self._write_joined()
            self._joined = None
        if self.reader.ended:
            self._pause()  # an oversize frame: the connection refuses it and closes
        elif self._pending_bytes > READ_PAUSE_BYTES:
            self._pause()
        if self.pending or self.reader.ended:
            self._input.set()

    def eof_received(self) -> bool:
        last = self.reader.finish()
        if last is not None and not self._stopped and not self._discarding:
            self.pending.append(last)
            self._pending_bytes += len(last)
        self.eof = True
        self._input.set()
        return True  # keep the socket open: our answers (and a subscriber's events) still go out

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.writable = False
        self._input.set()
        self._output.set()
        self._closed.set()

    def pause_writing(self) -> None:
        self.writable = False
        self._output.clear()

    def resume_writing(self) -> None:
        if not self.lost:
            self.writable = True
        self._output.set()

    # -- what the connection uses ----------------------------------------------------------

    @property
    def oversize(self) -> bool:
        return self.reader.oversize

    def socket(self) -> Any:
        return self.transport.get_extra_info("socket") if self.transport is not None else None

    def take(self) -> bytes | None:
        """The next frame waiting for admission, if any (resumes reading below half the cap)."""
        if not self.pending:
            return None
        frame = self.pending.popleft()
        self._pending_bytes -= len(frame)
        resume = self._read_paused and self._pending_bytes <= READ_PAUSE_BYTES // 2
        if resume and not (self.reader.ended or self._stopped) and self.transport is not None:
            self._read_paused = False
            self.transport.resume_reading()
        return frame

    async def wait_input(self) -> None:
        """Until something arrived (a frame, the end of input, an oversize frame, a loss).
        The caller checks the state first, without awaiting in between."""
        self._input.clear()
        await self._input.wait()

    def stop(self) -> None:
        """Read no more: frames not yet admitted are dropped, no frame is answered inline."""
        self._stopped = True
        self.fast = None
        self.pending.clear()
        self._pending_bytes = 0
        self._pause()
        self._input.set()

    def write(self, data: bytes) -> bool:
        """Hand `data` to the transport; False when the connection is gone."""
        transport = self.transport
        if self.lost or self._eof_written or transport is None or transport.is_closing():
            return False  # (asyncio raises on a write after write_eof)
        joined = self._joined
        if joined is None:
            transport.write(data)
            return True
        joined.append(data)
        self._joined_bytes += len(data)
        if self._joined_bytes + transport.get_write_buffer_size() > WRITE_HIGH:
            # As if each answer had been written: past the high-water mark the transport
            # pauses writing (`writable` turns False) after the same answer as it would have.
            self._write_joined()
        return True

    def _write_joined(self) -> None:
        joined = self._joined
        if not joined:
            return
        data = joined[0] if len(joined) == 1 else b"".join(joined)
        joined.clear()
        self._joined_bytes = 0
        transport = self.transport
        if not (self.lost or self._eof_written or transport is None or transport.is_closing()):
            transport.write(data)

    async def wait_writable(self) -> None:
        while not self.writable and not self.lost:
            await self._output.wait()

    def abort(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.abort()

    async def close(self, *, linger: bool) -> None:
        """Close, flushing what is buffered (bounded). With `linger`, first half-close and
        discard what the peer still sends (bounded in time and bytes): closing a Unix socket
        with unread input makes the peer's next read fail with ECONNRESET, and it would lose our
        last answer (a refusal, an oversize error)."""
        transport = self.transport
        if transport is None:
            return
        if linger and not self.lost:
            self.stop()
            self._discarding = True
            with anyio.move_on_after(LINGER_S):
                if transport.can_write_eof() and not transport.is_closing():
                    self._eof_written = True
                    transport.write_eof()  # after the buffered answers are written
                if not self.eof:
                    self._read_paused = False
                    transport.resume_reading()
                while not (self.eof or self.lost or self._discarded >= LINGER_BYTES):
                    await self.wait_input()
        if not self.lost:
            transport.close()
        with anyio.move_on_after(CLOSE_DEADLINE_S, shield=True):
            await self._closed.wait()
        if not self.lost:
            transport.abort()  # a peer that reads nothing: what is still buffered is dropped

    def _pause(self) -> None:
        if not self._read_paused and self.transport is not None and not self.lost:
            self._read_paused = True
            self.transport.pause_reading()
