"""The supervisor's task group, while it serves: where watchers and detached stops run.

Requests can arrive a moment before the background services start, and after shutdown began;
this says which (`running`, `stopping`) and lets a spawn wait, bounded, for the group.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.abc

SERVE_WAIT_S = 5.0


class TaskHost:
    def __init__(self) -> None:
        self.group: anyio.abc.TaskGroup | None = None
        self.stopping = False
        self._serving = anyio.Event()

    def attach(self, group: anyio.abc.TaskGroup) -> None:
        self.group = group
        self._serving.set()

    def detach(self) -> None:
        self.group = None

    @property
    def running(self) -> bool:
        return self.group is not None and not self.stopping

    async def wait_running(self) -> bool:
        """Wait (bounded) for the group if it is not there yet; False if it is not running."""
        if self.group is None and not self.stopping:
            with anyio.move_on_after(SERVE_WAIT_S):
                await self._serving.wait()
        return self.running

    def start_soon(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> bool:
        """Start `fn` in the group; False (nothing started) when the group is gone."""
        if self.group is None:
            return False
        self.group.start_soon(fn, *args)
        return True
