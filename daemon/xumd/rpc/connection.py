"""One client connection: read NDJSON frames, dispatch each, write responses in order of completion.

Reads and writes are separate tasks. Writes go through a bounded queue; a client that stops reading
fills it and is disconnected, so a slow or dead client never holds memory or blocks anyone else.
Requests on one connection run concurrently (bounded per connection), so a long archive does not
hold up a status call pipelined behind it. Requests run in the server's task group, not the
connection's: a client that disconnects mid-archive does not cancel the archive half-way; its
answer is dropped.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import anyio
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream
from xum_protocol import framing
from xum_protocol.errors import ErrorKind
from xum_protocol.version import PROTOCOL_VERSION

from xumd import logs
from xumd.rpc.dispatch import Router, error_response

log = logs.get("xumd.conn")

_ids = itertools.count(1)


class Connection:
    def __init__(
        self,
        stream: SocketStream,
        router: Router,
        *,
        pid: int | None,
        uid: int | None,
        max_frame: int,
        max_inflight: int,
        queue_size: int,
        work: anyio.abc.TaskGroup,
    ) -> None:
        self.id = next(_ids)
        self.pid = pid
        self.uid = uid
        self.protocol = PROTOCOL_VERSION
        self._stream = stream
        self._router = router
        self._max_frame = max_frame
        self._work = work
        self._inflight = anyio.Semaphore(max_inflight)
        self._max_inflight = max_inflight
        self._send, self._outbox = anyio.create_memory_object_stream[bytes](queue_size)
        self._close_callbacks: list[Callable[[], None]] = []
        self._closed = False
        self._cancel = anyio.CancelScope()

    # -- Peer protocol (what handlers see) -------------------------------------------------

    def notify(self, method: str, params: dict[str, Any]) -> bool:
        """Queue a notification; False if the connection is gone or too slow (then it closes)."""
        return self._enqueue({"jsonrpc": "2.0", "method": method, "params": params})

    def on_close(self, callback: Callable[[], None]) -> None:
        if self._closed:
            callback()
        else:
            self._close_callbacks.append(callback)

    def close(self) -> None:
        self._cancel.cancel()

    # -- internals ---------------------------------------------------------------------------

    def _enqueue(self, message: Any) -> bool:
        if self._closed:
            return False
        try:
            self._send.send_nowait(framing.encode(message))
        except anyio.WouldBlock:
            log.warning("conn.slow_client_dropped", conn=self.id, pid=self.pid)
            self._cancel.cancel()
            return False
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True

    async def serve(self) -> None:
        with self._cancel:
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._writer)
                    await self._reader()
                    # EOF: let in-flight requests answer, then stop the writer.
                    await self._drain_inflight()
                    self._send.close()
            finally:
                self._finish()
        await self._aclose_stream()

    async def _drain_inflight(self) -> None:
        for _ in range(self._max_inflight):
            await self._inflight.acquire()

    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._send.close()
        for callback in self._close_callbacks:
            try:
                callback()
            except Exception:
                log.exception("conn.close_callback_failed", conn=self.id)

    async def _aclose_stream(self) -> None:
        with anyio.move_on_after(1, shield=True):
            await self._stream.aclose()

    async def _writer(self) -> None:
        async with self._outbox:
            async for frame in self._outbox:
                try:
                    await self._stream.send(frame)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    self._cancel.cancel()
                    return

    async def _reader(self) -> None:
        reader = BufferedByteReceiveStream(self._stream)
        while True:
            try:
                frame = await reader.receive_until(framing.DELIMITER, self._max_frame)
            except anyio.IncompleteRead:
                # EOF. A final frame without its newline is still a frame.
                rest = bytes(reader.buffer)
                if rest.strip():
                    await self._admit(rest)
                return
            except anyio.DelimiterNotFound:
                log.warning("conn.frame_too_large", conn=self.id, limit=self._max_frame)
                self._enqueue(
                    error_response(
                        None,
                        ErrorKind.FRAME_TOO_LARGE,
                        f"frame exceeds the {self._max_frame}-byte limit; closing the connection",
                        {"limit": self._max_frame},
                    )
                )
                return
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                return
            if frame.strip():
                await self._admit(frame)

    async def _admit(self, frame: bytes) -> None:
        await self._inflight.acquire()
        self._work.start_soon(self._process, frame)

    async def _process(self, frame: bytes) -> None:
        try:
            try:
                message = framing.decode(frame)
            except ValueError:
                self._enqueue(
                    error_response(None, ErrorKind.PARSE_ERROR, "parse error: invalid JSON")
                )
                return
            if isinstance(message, list):
                if not message:
                    self._enqueue(error_response(None, ErrorKind.INVALID_REQUEST, "empty batch"))
                    return
                answers: list[dict[str, Any] | None] = [None] * len(message)

                async def one(index: int, item: Any) -> None:
                    answers[index] = await self._router.handle(item, self)

                async with anyio.create_task_group() as batch:
                    for index, item in enumerate(message):
                        batch.start_soon(one, index, item)
                replies = [a for a in answers if a is not None]
                if replies:
                    self._enqueue(replies)
                return
            reply = await self._router.handle(message, self)
            if reply is not None:
                self._enqueue(reply)
        finally:
            self._inflight.release()
