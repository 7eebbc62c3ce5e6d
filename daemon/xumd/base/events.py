"""The event bus: every state change gets a sequence number and reaches every subscriber.

`publish` is synchronous and assigns the number at once, so a handler that builds a snapshot
without awaiting and then reads `seq` gets a snapshot valid exactly at that number: nothing can
slip between snapshot and stream. Internal services (the cleanup-retry service) wait on `changed`.

The last `ring_size` events (at most `ring_bytes` of them) are kept, so a client that
reconnects can resume where it stopped (`events.subscribe {after_seq, epoch}`) instead of taking a
new snapshot. The epoch is random per daemon start: a sequence number from another run is never
mistaken for one of this run.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections import deque
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

import orjson

from xumd.base import logs

if TYPE_CHECKING:
    from xum_protocol.models.events import Event

log = logs.get("xumd.base.events")

Listener = Callable[["Event"], None]
SnapshotProvider = Callable[[], Any]
PagedSnapshotProvider = Callable[[int], tuple[list[Any], str | None]]
"""The first `limit` items of a listing and the cursor of the rest (None: there is no rest)."""

DEFAULT_RING_SIZE = 4096
DEFAULT_RING_BYTES = 32 * 1024 * 1024


@cache
def _event_model() -> type[Event]:
    """The protocol's event model, loaded at the first event (after readiness: only features
    publish), not on the way to it."""
    from xum_protocol.models.events import Event

    return Event


class EventBus:
    def __init__(
        self, ring_size: int = DEFAULT_RING_SIZE, ring_bytes: int = DEFAULT_RING_BYTES
    ) -> None:
        self.epoch = secrets.token_hex(8)
        self.seq = 0
        # Bounded in events and in bytes: setup output (script.printed) can make events large.
        self._ring: deque[tuple[Event, int]] = deque()
        self._ring_size = max(ring_size, 0)
        self._ring_bytes = max(ring_bytes, 0)
        self._ring_used = 0
        self._listeners: dict[int, Listener] = {}
        self._next_token = 0
        self._snapshot_providers: dict[str, SnapshotProvider] = {}
        self._paged_providers: dict[str, PagedSnapshotProvider] = {}

    def publish(self, type: str, **data: Any) -> Event:
        self.seq += 1
        event = _event_model()(seq=self.seq, epoch=self.epoch, type=type, at=time.time(), data=data)
        self._keep(event, data)
        for token, listener in list(self._listeners.items()):
            try:
                listener(event)
            except Exception:
                log.exception("events.listener_failed", token=token, type=type)
        return event

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` synchronously for each event; returns an unsubscribe function."""
        token = self._next_token
        self._next_token += 1
        self._listeners[token] = listener
        return lambda: self._listeners.pop(token, None) and None

    def _keep(self, event: Event, data: dict[str, Any]) -> None:
        if not self._ring_size:
            return
        size = _size(data)
        self._ring.append((event, size))
        self._ring_used += size
        while self._ring and (
            len(self._ring) > self._ring_size or self._ring_used > self._ring_bytes
        ):
            _, dropped = self._ring.popleft()
            self._ring_used -= dropped

    def replay_after(self, after_seq: int) -> list[Event] | None:
        """Every event after `after_seq` up to now, in order; None when the ring no longer holds
        the one right after it (or `after_seq` is ahead of this run): then only a snapshot is
        a sound start."""
        if after_seq > self.seq:
            return None
        if after_seq == self.seq:
            return []
        if not self._ring or self._ring[0][0].seq > after_seq + 1:
            return None
        # The ring holds consecutive numbers ending at self.seq.
        start = after_seq + 1 - self._ring[0][0].seq
        return [event for event, _ in itertools.islice(self._ring, start, None)]

    def add_snapshot_provider(self, name: str, provider: SnapshotProvider) -> None:
        self._snapshot_providers[name] = provider

    def add_paged_snapshot_provider(
        self, name: str, provider: SnapshotProvider, page: PagedSnapshotProvider
    ) -> None:
        """A part that can be too large for one answer (the workspaces of a big root): whole
        by `provider`, or its first page by `page` when a subscriber asks for a bounded one."""
        self._snapshot_providers[name] = provider
        self._paged_providers[name] = page

    def snapshot(self, limit: int | None = None) -> tuple[int, dict[str, Any], dict[str, str]]:
        """A snapshot of every provider and the sequence number it is valid at. With `limit`,
        a paged part holds at most `limit` items, and the third value maps each part cut
        short to the cursor of its rest."""
        parts: dict[str, Any] = {}
        rest: dict[str, str] = {}
        for name, fn in self._snapshot_providers.items():
            page = self._paged_providers.get(name)
            if limit is None or page is None:
                parts[name] = fn()
                continue
            parts[name], cursor = page(limit)
            if cursor is not None:
                rest[name] = cursor
        return self.seq, parts, rest


def _size(data: dict[str, Any]) -> int:
    """About the bytes an event's data takes (its JSON; the envelope is small)."""
    try:
        return len(orjson.dumps(data, default=str)) + 100
    except (TypeError, ValueError):
        return len(repr(data)) + 100
