"""Events: every state change, numbered; `events.subscribe` starts with a snapshot."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from xum_protocol.methods_base import MethodSpec
from xum_protocol.models.base import Params, Result

EVENT_NOTIFICATION = "event"
"""The notification method that carries one Event on a subscribed connection."""


class Event(Result):
    seq: int = Field(description="Monotonically increasing within one daemon run (epoch).")
    epoch: str = Field(description="Identifies the daemon run; a new epoch means resync.")
    type: str = Field(description="e.g. workspace.state_changed, cleanup.obligation_changed")
    at: float
    data: dict[str, Any] = Field(default_factory=dict)


class SubscribeParams(Params):
    types: list[str] | None = Field(
        default=None, description="Only these event types (prefix match, e.g. 'workspace.')."
    )


class SubscribeResult(Result):
    epoch: str
    seq: int = Field(description="The snapshot is valid at this sequence number; events follow.")
    snapshot: dict[str, Any]


METHODS = [
    MethodSpec(
        "events.subscribe",
        SubscribeParams,
        SubscribeResult,
        "Snapshot plus a stream of `event` notifications on this connection.",
    ),
]
