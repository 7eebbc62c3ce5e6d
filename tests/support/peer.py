"""A connection stand-in for driving a `Router` in memory (`handle_now`, `handle`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class NullPeer:
    """A peer that was never connected: notifications go nowhere, nothing closes it."""

    id = 0
    pid: int | None = None
    uid: int | None = None
    protocol = "1.0"

    def notify(self, method: str, params: dict[str, Any]) -> bool:
        return False

    def on_close(self, callback: Callable[[], None]) -> None:
        pass

    def keep_streaming(self) -> None:
        pass
