"""A connection's bounded write queue, bounded both in messages and in bytes.

Responses wait for room (`put`): a client that pipelines faster than it reads is slowed down by
backpressure, since its reader stops admitting frames while its in-flight slots are full.
Notifications cannot wait (events are published synchronously), so `put_nowait` says when the queue
is full, and the connection then drops that subscriber: one slow client never holds unbounded
memory, and never blocks anyone else, because every connection has its own queue and writer.
"""

from __future__ import annotations

from collections import deque

import anyio


class OutboxClosed(Exception):
    pass


class Outbox:
    def __init__(self, max_messages: int, max_bytes: int) -> None:
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self.frames: deque[bytes] = deque()
        """What is queued, oldest first (read it, never change it: `put*` and `get` do). A plain
        attribute, as is `closed`: the connection looks at both for every answer it writes."""
        self._bytes = 0
        self.closed = False
        self._changed = anyio.Event()

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self.frames)

    def _has_room(self, size: int) -> bool:
        # An empty queue takes any one frame, so a single large answer can always go out.
        if not self.frames:
            return True
        return len(self.frames) < self._max_messages and self._bytes + size <= self._max_bytes

    def _wake(self) -> None:
        event, self._changed = self._changed, anyio.Event()
        event.set()

    def put_nowait(self, frame: bytes) -> bool:
        """Queue `frame` if there is room; False when full. Raises OutboxClosed once closed."""
        if self.closed:
            raise OutboxClosed
        if not self._has_room(len(frame)):
            return False
        self.frames.append(frame)
        self._bytes += len(frame)
        self._wake()
        return True

    async def put(self, frame: bytes) -> None:
        """Queue `frame`, waiting for room (the caller bounds the wait by cancellation)."""
        while not self.put_nowait(frame):
            await self._changed.wait()

    async def get(self) -> bytes | None:
        """The next frame, or None once the queue is closed and empty."""
        while not self.frames:
            if self.closed:
                return None
            await self._changed.wait()
        frame = self.frames.popleft()
        self._bytes -= len(frame)
        self._wake()
        return frame

    def close(self) -> None:
        """No more frames; `get` drains what is queued, then returns None."""
        self.closed = True
        self._wake()
