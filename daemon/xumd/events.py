"""The event bus: every state change gets a sequence number and reaches every subscriber.

`publish` is synchronous and assigns the number at once, so a handler that builds a snapshot
without awaiting and then reads `seq` gets a snapshot valid exactly at that number: nothing can
slip between snapshot and stream. Internal services (the cleanup-retry service) wait on `changed`.

The last `ring_size` events are kept, so a client that reconnects can resume where it stopped
(`events.subscribe {after_seq, epoch}`) instead of taking a new snapshot. The epoch is random per
daemon start: a sequence number from another run is never mistaken for one of this run.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
from xum_protocol.models.events import Event

from xumd import logs

log = logs.get("xumd.events")

Listener = Callable[[Event], None]
SnapshotProvider = Callable[[], Any]

DEFAULT_RING_SIZE = 4096


class EventBus:
    def __init__(self, ring_size: int = DEFAULT_RING_SIZE) -> None:
        self.epoch = secrets.token_hex(8)
        self.seq = 0
        self._ring: deque[Event] = deque(maxlen=max(ring_size, 0))
        self._listeners: dict[int, Listener] = {}
        self._next_token = 0
        self._changed = anyio.Event()
        self._snapshot_providers: dict[str, SnapshotProvider] = {}

    def publish(self, type: str, **data: Any) -> Event:
        self.seq += 1
        event = Event(seq=self.seq, epoch=self.epoch, type=type, at=time.time(), data=data)
        if self._ring.maxlen:
            self._ring.append(event)
        for token, listener in list(self._listeners.items()):
            try:
                listener(event)
            except Exception:
                log.exception("events.listener_failed", token=token, type=type)
        self._changed.set()
        self._changed = anyio.Event()
        return event

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` synchronously for each event; returns an unsubscribe function."""
        token = self._next_token
        self._next_token += 1
        self._listeners[token] = listener
        return lambda: self._listeners.pop(token, None) and None

    async def wait_changed(self, timeout: float) -> bool:
        """Wait until the next event or the timeout; True if an event came."""
        changed = self._changed
        with anyio.move_on_after(timeout):
            await changed.wait()
            return True
        return False

    def replay_after(self, after_seq: int) -> list[Event] | None:
        """Every event after `after_seq` up to now, in order; None when the ring no longer holds
        the one right after it (or `after_seq` is ahead of this run): then only a snapshot is
        a sound start."""
        if after_seq > self.seq:
            return None
        if after_seq == self.seq:
            return []
        if not self._ring or self._ring[0].seq > after_seq + 1:
            return None
        # The ring holds consecutive numbers ending at self.seq.
        return list(itertools.islice(self._ring, after_seq + 1 - self._ring[0].seq, None))

    def add_snapshot_provider(self, name: str, provider: SnapshotProvider) -> None:
        self._snapshot_providers[name] = provider

    def snapshot(self) -> tuple[int, dict[str, Any]]:
        """A snapshot of every provider and the sequence number it is valid at."""
        return self.seq, {name: fn() for name, fn in self._snapshot_providers.items()}
