"""Every event type the daemon publishes, with the typed model of its `data`: the catalog that
docs/PROTOCOL.md and the JSON Schema are generated from (`make schema`). A test scans the daemon's
`publish(...)` calls, so a new type (or a new field at a call site) that is not listed here fails;
another drives a real daemon and validates every event it sends against `TYPED_EVENT`."""

from __future__ import annotations

import builtins
import functools
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Field, TypeAdapter, create_model

from xum_protocol.models.base import Result
from xum_protocol.models.event_data import (
    GcBudgetExceededData,
    GcEvictedData,
    LeaseData,
    LeaseReleasedData,
    ObligationData,
    PoolRefilledData,
    ProcessData,
    ProjectData,
    ProjectRemovedData,
    ProjectTrustedData,
    ScriptPrintedData,
    ScriptStartedData,
    TurnData,
    WorkspaceAutoArchiveData,
    WorkspaceData,
    WorkspaceInterruptedData,
    WorkspaceRemovedData,
    WorkspaceRenamedData,
    WorkspaceStateChangedData,
)


@dataclass(frozen=True, slots=True)
class EventType:
    type: str
    summary: str
    model: builtins.type[BaseModel]
    """The typed `data` of this event type (`xum_protocol.models.event_data`)."""

    @property
    def data(self) -> dict[str, str]:
        """Field name -> what it holds. A trailing `?` on the name: present only sometimes."""
        return {
            (name if field.is_required() else f"{name}?"): field.description or ""
            for name, field in self.model.model_fields.items()
        }


EVENT_TYPES: tuple[EventType, ...] = (
    EventType("project.added", "A project was registered.", ProjectData),
    EventType(
        "project.trusted", "A project's `.xum/config.toml` hash was trusted.", ProjectTrustedData
    ),
    EventType(
        "project.removed", "A project was removed (after all its workspaces).", ProjectRemovedData
    ),
    EventType(
        "workspace.created",
        "The intent of a create was committed (state `creating`); nothing is on disk yet.",
        WorkspaceData,
    ),
    EventType(
        "workspace.updated",
        "A field other than the state changed (setup started: `setup.status` `running`).",
        WorkspaceData,
    ),
    EventType(
        "workspace.state_changed",
        "A committed state change: `creating` → `active`, `archiving`, `archived`, `restoring`, "
        "`removing`, a rollback, or a repair by the start-up recovery pass.",
        WorkspaceStateChangedData,
    ),
    EventType(
        "workspace.renamed",
        "A rename was committed (name, path, and the default branch).",
        WorkspaceRenamedData,
    ),
    EventType(
        "workspace.interrupted",
        "The recovery pass (or a rename whose undo failed) flagged a workspace for the user.",
        WorkspaceInterruptedData,
    ),
    EventType(
        "workspace.removed",
        "The row is gone: a committed removal (its cleanup may still be pending), or an undone "
        "create.",
        WorkspaceRemovedData,
    ),
    EventType(
        "workspace.auto_archive",
        "An auto-archive attempt (`auto_archive: on_agent_exit`) ended.",
        WorkspaceAutoArchiveData,
    ),
    EventType(
        "script.started",
        "A setup command starts (published while `workspace.create`/`unarchive` wait).",
        ScriptStartedData,
    ),
    EventType(
        "script.printed",
        "Lines a setup command printed (bounded: line length and lines per run).",
        ScriptPrintedData,
    ),
    EventType(
        "cleanup.obligation_changed",
        "A cleanup obligation was planned, attempted, completed, abandoned or failed.",
        ObligationData,
    ),
    EventType("process.started", "A supervised process started.", ProcessData),
    EventType(
        "process.adopted",
        "A process kept across a daemon restart was found alive and adopted.",
        ProcessData,
    ),
    EventType(
        "process.stopping", "A stop began (SIGTERM sent; SIGKILL after the grace).", ProcessData
    ),
    EventType(
        "process.backgrounded", "A foreground exec was detached from its caller.", ProcessData
    ),
    EventType(
        "process.kept",
        "Left running at the daemon's stop (keep_processes), for adoption at the next start.",
        ProcessData,
    ),
    EventType(
        "process.exited",
        "A supervised process ended (`exit` says how it was settled, and `exit.leftovers` what "
        "it left running, which the daemon stopped then).",
        ProcessData,
    ),
    EventType(
        "lease.acquired",
        "A use lease on a workspace's checkout was taken (or its holder updated).",
        LeaseData,
    ),
    EventType("lease.released", "A lease was removed.", LeaseReleasedData),
    EventType(
        "turn.created", "A delegated turn was opened (its target workspace bound to it).", TurnData
    ),
    EventType("turn.ended", "A delegated turn was ended.", TurnData),
    EventType(
        "gc.evicted",
        "An idle workspace's rebuildable directory was moved to the trash to keep the disk "
        "budget (`[gc]`); its reclaim deletes it.",
        GcEvictedData,
    ),
    EventType(
        "gc.budget_exceeded",
        "A disk budget cannot be met (what is left is busy, in use or not rebuildable): once "
        "per episode, until it holds again.",
        GcBudgetExceededData,
    ),
    EventType(
        "pool.refilled",
        "A warm pool checkout was made ready in the background (`[create] pool`).",
        PoolRefilledData,
    ),
)


class TypedEventBase(Result):
    """The envelope every typed event shares (the `event` notification's params)."""

    seq: int = Field(description="Grows by one per event within one daemon run (epoch).")
    epoch: str = Field(description="Identifies the daemon run; a new epoch means resync.")
    at: float = Field(description="When it was published (Unix time, seconds).")


def _title(type_: str) -> str:
    """`workspace.state_changed` -> `WorkspaceStateChangedEvent`."""
    words = type_.replace(".", "_").split("_")
    return "".join(word.capitalize() for word in words) + "Event"


def _typed(event: EventType) -> type[TypedEventBase]:
    model: type[TypedEventBase] = create_model(
        _title(event.type),
        __base__=TypedEventBase,
        __doc__=event.summary,
        type=(Literal[event.type], ...),  # type: ignore[arg-type]
        data=(event.model, ...),
    )
    return model


TYPED_EVENTS: dict[str, type[TypedEventBase]] = {e.type: _typed(e) for e in EVENT_TYPES}
"""Event type -> the typed model of the whole event (envelope, `type` literal, typed `data`)."""

TYPED_EVENT: Any = Annotated[
    Union[tuple(TYPED_EVENTS.values())],  # noqa: UP007 (a union built at run time)
    Field(discriminator="type"),
]
"""The discriminated union of every typed event (on `type`). A client must still accept an event
type it does not know (additive within a major version): validate with `typed_event_adapter()`
only events whose `type` is in `TYPED_EVENTS`."""


@functools.cache
def typed_event_adapter() -> TypeAdapter[Any]:
    """Validates (and parses) one event as `TYPED_EVENT`; built on first use (start-up cost)."""
    return TypeAdapter(TYPED_EVENT)
