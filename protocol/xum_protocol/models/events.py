"""Events: every state change, numbered; `events.subscribe` starts with a snapshot."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

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
    after_seq: int | None = Field(
        default=None,
        ge=0,
        description="Resume: the last `seq` this client saw (with `epoch`). The answer replays "
        "the events after it (`events`) instead of a snapshot, or says `resync_required`. "
        "Since 1.1.",
    )
    epoch: str | None = Field(
        default=None,
        max_length=64,
        description="Resume: the `epoch` that `after_seq` belongs to; required with `after_seq`. "
        "Another epoch (the daemon restarted) means `resync_required`. Since 1.1.",
    )

    snapshot_limit: int | None = Field(
        default=None,
        ge=1,
        le=10_000,  # workspace.list's LIST_PAGE_MAX
        strict=True,
        description="A bounded snapshot: its `workspaces` holds at most this many (1 to 10,000; "
        "fewer when they would pass about 4 MiB), the first page of `workspace.list` with this "
        "`limit`, and the answer's `workspaces_next` is the `after` of the rest (fetch it on "
        "this connection: each page then shows at least every event before its answer). "
        "Unset: every workspace, in one answer. Since 1.3, additive.",
    )

    @model_validator(mode="after")
    def _resume_needs_both(self) -> SubscribeParams:
        if (self.after_seq is None) != (self.epoch is None):
            raise ValueError("after_seq and epoch go together: give both to resume, or neither")
        return self


class SubscribeResult(Result):
    epoch: str = Field(description="This daemon run's epoch.")
    seq: int = Field(
        description="The state is valid at this sequence number (the snapshot's, or the last "
        "replayed event's): every later event follows as a notification, none before it."
    )
    snapshot: dict[str, Any] | None = Field(
        description="`projects`, `workspaces`, live `processes`. Null only when a resume "
        "succeeded (`after_seq` given and `resync_required` false): `events` holds what was "
        "missed instead."
    )
    resync_required: bool = Field(
        default=False,
        description="A resume (`after_seq`) could not be honoured: another epoch (a restart), "
        "the replay ring no longer holds the event after `after_seq`, `after_seq` is ahead of "
        "this run, or the replay would not fit in half of `max_frame_bytes`. The snapshot is "
        "given: replace the client's state with it. Since 1.1.",
    )
    events: list[Event] = Field(
        default_factory=list,
        description="A successful resume: the events after `after_seq` up to `seq` that match "
        "`types`, in order (each as an `event` notification's params). Since 1.1.",
    )
    workspaces_next: str | None = Field(
        default=None,
        description="With `snapshot_limit`: the snapshot holds only the first workspaces, and "
        "this is the `after` of `workspace.list` (with a `limit`) for the rest; null when the "
        "snapshot holds them all (or there is no snapshot). Since 1.3, additive.",
    )


EVENTS_SUBSCRIBE = MethodSpec(
    "events.subscribe",
    SubscribeParams,
    SubscribeResult,
    "Snapshot plus a stream of `event` notifications on this connection.",
)
