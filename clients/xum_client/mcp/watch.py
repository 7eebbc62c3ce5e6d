"""The event watcher: one connection to the daemon, held for as long as `xum mcp` runs, that
follows its workspace events and says what each changed (`resources.change_of`) to one
`Changes` sink, whatever protocol revision the agent speaks (`server.Publisher` fans it out).

When the connection breaks it resumes from the last event it saw (`after_seq` with the run's
`epoch`); a daemon that restarted (or no longer holds the events) means every resource may have
changed, which is what it then says (`Changes.everything`). No MCP SDK import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import anyio

from xum_client.aio import AsyncClient
from xum_client.errors import XumClientError
from xum_client.mcp import resources

log = logging.getLogger("xum.mcp")

RECONNECT_MAX_S = 5.0


class Changes(Protocol):
    """Where the watcher says what changed."""

    async def changed(self, change: resources.Change) -> None:
        """One event's change."""

    async def everything(self) -> None:
        """Events were missed: every resource may have changed."""


async def watch(connect: Callable[[], AsyncClient], changes: Changes, ready: anyio.Event) -> None:
    """Follow the daemon's workspace events for as long as the server runs; `ready` is set at
    the first subscription (or the first failure to make one)."""
    after_seq: int | None = None
    epoch: str | None = None
    missed = False
    """No daemon answered at some point before the first subscription: what an agent read then
    was an error, so the first subscription is a change of everything."""
    delay = 0.1
    while True:
        try:
            async with (
                connect() as client,
                client.subscribe(resources.WATCHED, after_seq=after_seq, epoch=epoch) as stream,
            ):
                if stream.snapshot.resync_required or (missed and after_seq is None):
                    await changes.everything()
                after_seq, epoch = stream.position, stream.epoch
                ready.set()
                delay = 0.1
                async for event in stream:
                    after_seq = stream.position
                    change = resources.change_of(event.type, event.data)
                    if change.uris or change.list_changed:
                        await changes.changed(change)
        except XumClientError as exc:
            log.info("event stream: %s; reconnecting", exc)
            missed = True
        except Exception as exc:
            # Anything else (an event this client cannot read) must not end the server: the
            # tools do not need the stream. Said on stderr, then the stream is taken up again.
            log.warning("event stream: %r; reconnecting", exc)
            missed = True
        # No daemon yet (or it just went): serve anyway, tools say `no_daemon` meanwhile.
        ready.set()
        await anyio.sleep(delay)
        delay = min(delay * 2, RECONNECT_MAX_S)
