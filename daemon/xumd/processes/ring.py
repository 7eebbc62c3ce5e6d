"""A bounded output ring addressed by absolute byte offsets.

The first `head` bytes are kept forever (how a command started is often the diagnosis), the last
`tail` bytes are kept as a ring, and what falls between is counted. Readers address bytes by their
offset in the whole stream, so a reader that fell behind learns exactly how much it missed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio


@dataclass(slots=True)
class Chunk:
    start: int
    data: bytes
    dropped: int


class Waitable:
    """Long-poll support for a byte stream (the ring, and the durable log): readers wait for
    bytes past an offset; `_wake()` after each change."""

    total: int
    closed: bool
    _changed: anyio.Event | None

    async def wait_beyond(self, offset: int, timeout: float) -> None:
        """Return once there are bytes past `offset`, the stream closed, or the timeout passed."""
        with anyio.move_on_after(timeout):
            while self.total <= offset and not self.closed:
                if self._changed is None:
                    self._changed = anyio.Event()
                await self._changed.wait()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None


@dataclass
class OutputRing(Waitable):
    head_limit: int = 32 * 1024
    tail_limit: int = 224 * 1024
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0
    dropped: int = 0
    closed: bool = False
    _changed: anyio.Event | None = None

    @property
    def tail_start(self) -> int:
        return self.total - len(self.tail)

    def feed(self, data: bytes) -> None:
        if not data:
            return
        room = self.head_limit - len(self.head)
        if room > 0 and not self.tail:
            taken = data[:room]
            self.head += taken
            self.total += len(taken)
            data = data[room:]
        if data:
            self.tail += data
            self.total += len(data)
            excess = len(self.tail) - self.tail_limit
            if excess > 0:
                del self.tail[:excess]
                self.dropped += excess
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def read(self, since: int, max_bytes: int) -> Chunk:
        """Bytes from offset `since` (clamped to what is kept), at most `max_bytes`."""
        since = min(max(since, 0), self.total)
        if since < len(self.head):
            data = bytes(self.head[since : since + max_bytes])
            if len(data) < max_bytes and self.tail_start == len(self.head):
                data += bytes(self.tail[: max_bytes - len(data)])
            return Chunk(since, data, 0)
        start = max(since, self.tail_start)
        offset = start - self.tail_start
        return Chunk(start, bytes(self.tail[offset : offset + max_bytes]), start - since)
