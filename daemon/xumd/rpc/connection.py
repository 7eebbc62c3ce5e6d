"""One client connection: read NDJSON frames, dispatch each, write responses in order of completion.

Reads and writes are separate tasks, joined by a bounded outbox (messages and bytes). Responses
wait for room in it, and each frame holds one of a bounded number of in-flight slots until its
response is queued; so a client that sends without reading is slowed down by backpressure (its
reader stops admitting frames) and never holds more than a bounded amount of memory. Event
notifications cannot wait: a subscriber whose outbox is full is disconnected. Nothing here is
shared between connections, so one slow or dead client never blocks another.

Requests on one connection run concurrently, so a long archive does not hold up a status call
pipelined behind it. They run in the server's task group, not the connection's: a client that
disconnects mid-archive does not cancel the archive half-way; its answer is dropped. At shutdown
the server cancels requests still running after the grace period; one that committed nothing
answers `shutting_down`, one that committed its logical change answers its result as the cut left
it (`requestcut.answer_if_cut`), so a request with an id never goes unanswered nor falsely answered.

End of input ends a connection once its pending answers are written, except for an event
subscriber: a client that subscribes and then shuts down its sending side (as `socat` does when
its input ends) keeps receiving events until it closes the connection itself (seen as a hangup
on the socket, checked every `HANGUP_POLL_S`, or as a failed write), until the daemon stops, or
until it is dropped for not reading.
"""

from __future__ import annotations

import itertools
import select
from collections.abc import Callable
from typing import Any

import anyio
import orjson
from xum_protocol import framing
from xum_protocol.errors import ErrorKind
from xum_protocol.version import PROTOCOL_VERSION

from xumd.base import logs
from xumd.rpc.dispatch import LATER, Router, error_response, expects_reply
from xumd.rpc.outbox import Outbox, OutboxClosed
from xumd.rpc.transport import FrameProtocol

log = logs.get("xumd.conn")

_ids = itertools.count(1)

HANGUP_POLL_S = 1.0
"""How often a half-closed subscriber's socket is checked for a hangup (the peer closed it)."""


class Connection:
    def __init__(
        self,
        proto: FrameProtocol,
        router: Router,
        *,
        pid: int | None,
        uid: int | None,
        max_frame: int,
        max_inflight: int,
        queue_size: int,
        queue_bytes: int,
        max_batch: int,
        work: anyio.abc.TaskGroup,
    ) -> None:
        self.id = next(_ids)
        self.pid = pid
        self.uid = uid
        self.protocol = PROTOCOL_VERSION
        self._proto = proto
        self._router = router
        self._max_frame = max_frame
        self._max_batch = max_batch
        self._work = work
        self._inflight = anyio.Semaphore(max_inflight)
        self._max_inflight = max_inflight
        self._outbox = Outbox(queue_size, queue_bytes)
        self._close_callbacks: list[Callable[[], None]] = []
        self._closed = False
        self._cancel = anyio.CancelScope()
        self._reading = anyio.CancelScope()
        self._saw_eof = False
        self._streaming = False
        self._end_streaming = anyio.Event()

    # -- Peer protocol (what handlers see) -------------------------------------------------

    def notify(self, method: str, params: dict[str, Any]) -> bool:
        """Queue a notification; False if the connection is gone or too slow (then it closes)."""
        return self._enqueue_nowait({"jsonrpc": "2.0", "method": method, "params": params})

    def on_close(self, callback: Callable[[], None]) -> None:
        if self._closed:
            callback()
        else:
            self._close_callbacks.append(callback)

    def close(self) -> None:
        """Close now: queued answers are dropped."""
        self._cancel.cancel()

    def stop_reading(self) -> None:
        """Close gracefully: read no more frames, let in-flight frames answer, flush, close."""
        self._proto.stop()
        self._reading.cancel()
        self._end_streaming.set()

    def keep_streaming(self) -> None:
        """This connection subscribed to events: the end of its input (a half-close) does not
        end it; events keep coming until the peer hangs up or the daemon stops."""
        self._streaming = True

    # -- internals ---------------------------------------------------------------------------

    def _encode(self, message: Any) -> bytes:
        try:
            return framing.encode(message)
        except (TypeError, ValueError) as exc:
            # A result the codec cannot write (an integer over 64 bits, say) must not take the
            # connection or the daemon down: the client gets an internal error with its id.
            log.error("conn.encode_failed", conn=self.id, error=str(exc))
            return framing.encode(_unencodable(message))

    def _put_nowait(self, data: bytes) -> bool:
        """Send `data` now if nothing is queued before it and the transport takes it, else queue
        it if the outbox has room; False when it has none. Raises OutboxClosed once closed."""
        box = self._outbox
        if box.closed:
            raise OutboxClosed
        if not box.frames and self._proto.writable:
            # Nothing ahead of it and no backlog: straight to the transport, no writer wake-up.
            # A peer that is gone already is noticed by the reader (or the next queued write).
            self._proto.write(data)
            return True
        return box.put_nowait(data)

    def _enqueue_nowait(self, message: Any) -> bool:
        if self._closed:
            return False
        try:
            if self._put_nowait(self._encode(message)):
                return True
        except OutboxClosed:
            return False
        log.warning(
            "conn.slow_client_dropped",
            conn=self.id,
            pid=self.pid,
            queued=len(self._outbox),
            queued_bytes=self._outbox.queued_bytes,
        )
        self._cancel.cancel()
        return False

    async def _enqueue(self, message: Any) -> None:
        """Queue a response, waiting for room (backpressure on this connection only)."""
        if self._closed:
            return
        try:
            data = self._encode(message)
            if not self._put_nowait(data):
                await self._outbox.put(data)
        except OutboxClosed:
            pass

    async def serve(self) -> None:
        with self._cancel:
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._writer)
                    self._proto.fast = self._answer_inline
                    with self._reading:
                        await self._reader()
                    # EOF, oversize frame or graceful close: in-flight frames answer first.
                    self._proto.fast = None
                    await self._drain_inflight()
                    if self._streaming and self._saw_eof:
                        await self._stream_after_eof()
                    self._outbox.close()
            finally:
                self._proto.fast = None
                self._finish()
        if self._cancel.cancel_called:
            self._proto.abort()
            await self._proto.close(linger=False)
        else:
            await self._proto.close(linger=not self._saw_eof)

    async def _stream_after_eof(self) -> None:
        """A half-closed subscriber: keep the writer going until the peer hangs up or the
        daemon stops (stop_reading). A write that fails (the peer is gone) or a full outbox (it
        does not read) cancels the whole connection, this wait included."""
        raw = self._proto.socket()
        # A subscriber that closed its connection (not only its sending side) also reads as end
        # of input here: it is let go at once, not after a poll interval.
        if raw is None or _hung_up(raw):
            log.info("conn.subscriber_hung_up", conn=self.id, pid=self.pid)
            return
        log.info("conn.half_closed_subscriber", conn=self.id, pid=self.pid)
        while not self._end_streaming.is_set():
            with anyio.move_on_after(HANGUP_POLL_S):
                await self._end_streaming.wait()
            if _hung_up(raw):
                log.info("conn.subscriber_hung_up", conn=self.id, pid=self.pid)
                return

    async def _drain_inflight(self) -> None:
        for _ in range(self._max_inflight):
            await self._inflight.acquire()

    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._outbox.close()
        for callback in self._close_callbacks:
            try:
                callback()
            except Exception:
                log.exception("conn.close_callback_failed", conn=self.id)

    async def _writer(self) -> None:
        while (frame := await self._outbox.get()) is not None:
            if not self._proto.write(frame):
                self._cancel.cancel()
                return
            if not self._proto.writable:
                await self._proto.wait_writable()
                if self._proto.lost:
                    self._cancel.cancel()
                    return

    async def _reader(self) -> None:
        proto = self._proto
        while True:
            frame = proto.take()
            if frame is not None:
                if frame.strip():
                    await self._admit(frame)
                continue
            if proto.oversize:
                self._refuse_oversize()
                return
            if proto.eof:
                self._saw_eof = True
                return
            if proto.lost:
                return
            await proto.wait_input()

    def _answer_inline(self, frame: bytes) -> bool:
        """Called from the transport's read callback: answer `frame` now when that needs no
        await (a handler marked inline, or an error), else False (the reader task admits it)."""
        if (
            self._closed
            or self._outbox.frames
            or not self._proto.writable
            or self._router.stopping()
        ):
            return False
        try:
            message = orjson.loads(frame)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(message, dict):
            return False  # batches take the task path
        try:
            reply = self._router.handle_now(message, self, nul_free=framing.nul_free(frame))
        except Exception:
            # Last line of defence, as for a task: a bug costs this answer, never the daemon,
            # and a request with an id is still answered.
            log.exception("conn.process_failed", conn=self.id)
            wanted, request_id = expects_reply(message)
            reply = (
                error_response(request_id, ErrorKind.INTERNAL, "internal error; see the daemon log")
                if wanted
                else None
            )
        if reply is LATER:
            return False
        if reply is not None:
            self._enqueue_nowait(reply)
        return True

    def _refuse_oversize(self) -> None:
        log.warning("conn.frame_too_large", conn=self.id, limit=self._max_frame)
        self._enqueue_nowait(
            error_response(
                None,
                ErrorKind.FRAME_TOO_LARGE,
                f"frame exceeds the {self._max_frame}-byte limit; closing the connection",
                {"limit": self._max_frame},
            )
        )

    async def _admit(self, frame: bytes) -> None:
        if self._router.stopping():
            # Shutting down: past the grace the server's request group has ended and starts no
            # task (the frame would be dropped and the connection broken). What is still served
            # then (refusals, daemon.status) is quick: answer it here, in frame order.
            await self._process_inline(frame)
            return
        await self._inflight.acquire()
        self._work.start_soon(self._process, frame)

    async def _process_inline(self, frame: bytes) -> None:
        try:
            await self._process_frame(frame)
        except Exception:
            log.exception("conn.process_failed", conn=self.id)

    async def _process(self, frame: bytes) -> None:
        try:
            await self._process_frame(frame)
        except Exception:
            # Last line of defence: a bug here must cost one answer, never the daemon.
            log.exception("conn.process_failed", conn=self.id)
        finally:
            self._inflight.release()

    async def _process_frame(self, frame: bytes) -> None:
        try:
            message = framing.decode(frame)
        except ValueError:
            await self._enqueue(
                error_response(None, ErrorKind.PARSE_ERROR, "parse error: invalid JSON")
            )
            return
        nul_free = framing.nul_free(frame)
        if isinstance(message, list):
            await self._process_batch(message, nul_free)
            return
        try:
            reply = await self._router.handle(message, self, fragments=True, nul_free=nul_free)
        except anyio.get_cancelled_exc_class():
            self._answer_cancelled([message], [None], batch=False)
            raise
        if reply is not None:
            await self._enqueue_made(reply)

    async def _enqueue_made(self, reply: Any) -> None:
        """Queue an answer already made. Cancelled while waiting for room (shutdown), it is
        queued anyway: a request that committed its change is answered with its result
        (requestcut.answer_if_cut), never lost nor replaced by `shutting_down`."""
        try:
            await self._enqueue(reply)
        except anyio.get_cancelled_exc_class():
            self._enqueue_nowait(reply)
            raise

    async def _process_batch(self, batch: list[Any], nul_free: bool) -> None:
        if not batch:
            await self._enqueue(
                error_response(None, ErrorKind.INVALID_REQUEST, "invalid request: empty batch")
            )
            return
        if len(batch) > self._max_batch:
            # Bounded work per frame: each item would be a task and an answer.
            await self._enqueue(
                error_response(
                    None,
                    ErrorKind.INVALID_REQUEST,
                    f"invalid request: a batch holds at most {self._max_batch} messages",
                    {"limit": self._max_batch},
                )
            )
            return
        answers: list[dict[str, Any] | None] = [None] * len(batch)

        async def one(index: int, item: Any) -> None:
            answers[index] = await self._router.handle(
                item, self, fragments=True, nul_free=nul_free
            )

        try:
            async with anyio.create_task_group() as tg:
                for index, item in enumerate(batch):
                    tg.start_soon(one, index, item)
        except anyio.get_cancelled_exc_class():
            self._answer_cancelled(batch, answers, batch=True)
            raise
        replies = [answer for answer in answers if answer is not None]
        # A batch of notifications only gets no response at all, not an empty array.
        if replies:
            await self._enqueue_made(replies)

    def _answer_cancelled(
        self, messages: list[Any], answers: list[dict[str, Any] | None], *, batch: bool
    ) -> None:
        """Cancelled at shutdown: answers already made go out, the rest get `shutting_down`."""
        replies: list[dict[str, Any]] = []
        for message, answer in zip(messages, answers, strict=True):
            if answer is not None:
                replies.append(answer)
                continue
            wanted, request_id = expects_reply(message)
            if wanted:
                replies.append(
                    error_response(
                        request_id,
                        ErrorKind.SHUTTING_DOWN,
                        "the daemon is shutting down; the request was cancelled",
                    )
                )
        if not replies:
            return
        self._enqueue_nowait(replies if batch else replies[0])


def _hung_up(sock: Any) -> bool:
    """The peer closed its end entirely. A half-close (shutdown of its sending side) is only
    end of input; a Unix stream socket reports POLLHUP once both directions are shut."""
    try:
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLHUP | select.POLLERR)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True  # closed under us: nothing left to stream to


def _unencodable(message: Any) -> Any:
    """`message` with every response in it replaced by an internal error for the same id."""
    if isinstance(message, list):
        return [_unencodable(item) for item in message]
    request_id = message.get("id") if isinstance(message, dict) else None
    return error_response(
        request_id, ErrorKind.INTERNAL, "internal error: the result could not be encoded"
    )
