"""The setup phase of create and unarchive: `setup_status=running` committed before the script
runs (so a crash mid-setup is visible at startup), the outcome committed as soon as the script
returns (so a crash after it is not mistaken for an unfinished setup: recovery's
`SETUP_FINISHED`), then the row made `active`.

Setup progress as events (`ScriptEvents`), so a client can show it while `workspace.create` /
`unarchive` wait: `script.started` {workspace_id, project_id, name, phase, index, count, command}
before each command, and `script.printed` {..., index, lines} for its output, line by line.
The type names are not `workspace.*` on purpose: those wake the cleanup service, output must not.
What is streamed is bounded (line length, lines per run); the result and `workspace.get` keep the
output's head and diagnostic tail as before.
"""

from __future__ import annotations

import json
from typing import Any

from xum_protocol.models.workspace import ScriptResult

from xumd.base import faults, logs
from xumd.base.events import EventBus
from xumd.checkouts.marker import WorkspaceRef
from xumd.lifecycle.context import Context
from xumd.lifecycle.rows import WorkspaceRow
from xumd.lifecycle.scripts import Phase, ScriptOutcome

log = logs.get("xumd.lifecycle.setup")

SETUP_AFTER_INTENT = faults.declare(
    "workspace.setup.after_intent", "setup_status=running committed; the script has not run"
)


async def run(ctx: Context, row: WorkspaceRow) -> tuple[WorkspaceRow, ScriptOutcome]:
    with ctx.store.transaction():
        row = ctx.update(row, setup_status="running", setup_output=None)
    ctx.publish("workspace.updated", row)
    SETUP_AFTER_INTENT()
    try:
        ref = row.ref()
        outcome = await ctx.scripts.run(
            "setup",
            project_id=row.project_id,
            workspace=ref,
            cwd=row.path,
            progress=ScriptEvents(ctx.app.events, ref, "setup"),
        )
    except Exception as exc:  # a setup that cannot even start is reported, not raised
        log.exception("workspace.setup_crashed", workspace=row.id)
        outcome = ScriptOutcome(status="failed", error=f"setup could not run: {exc}")
    with ctx.store.transaction():
        row = ctx.update(row, **_outcome_fields(outcome))
    return row, outcome


def _outcome_fields(outcome: ScriptOutcome) -> dict[str, Any]:
    """The setup's outcome as row fields: its status, and its detail as JSON."""
    detail: dict[str, Any] = outcome.as_dict()
    detail.pop("status")
    return {"setup_status": outcome.status, "setup_output": json.dumps(detail)}


def activate(ctx: Context, row: WorkspaceRow, outcome: ScriptOutcome) -> WorkspaceRow:
    """Commit `active` (with the setup's outcome again: idempotent)."""
    with ctx.store.transaction():
        return ctx.update(row, state="active", **_outcome_fields(outcome))


def result(outcome: ScriptOutcome) -> ScriptResult:
    return ScriptResult.model_validate(outcome.as_dict())


MAX_LINE_CHARS = 500
MAX_LINES = 2000
"""Per run: a setup printing more is still run and kept (head + tail), not streamed further."""


class ScriptEvents:
    """A `scripts.ScriptProgress` that publishes on the event bus."""

    def __init__(self, events: EventBus, workspace: WorkspaceRef, phase: Phase) -> None:
        self.events = events
        self.base: dict[str, Any] = {
            "workspace_id": workspace.id,
            "project_id": workspace.project_id,
            "name": workspace.name,
            "phase": phase,
        }
        self._index = 0
        self._partial = b""
        self._sent = 0

    def started(self, index: int, count: int, command: str) -> None:
        self.finished()
        self._index = index
        self.events.publish(
            "script.started", **self.base, index=index, count=count, command=command[:1000]
        )

    def printed(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > MAX_LINE_CHARS * 4:  # a very long line: show what came so far
            lines.append(self._partial)
            self._partial = b""
        self._publish(lines)

    def finished(self) -> None:
        """Publish the last line of a command that did not end with a newline."""
        if self._partial:
            self._publish([self._partial])
            self._partial = b""

    def _publish(self, raw: list[bytes]) -> None:
        room = MAX_LINES - self._sent
        if not raw or room <= 0:
            return
        lines = [line.decode(errors="replace").rstrip("\r")[:MAX_LINE_CHARS] for line in raw]
        if len(lines) >= room:
            lines = [*lines[: room - 1], "[... more output; the result keeps its tail ...]"]
        self._sent += len(lines)
        self.events.publish("script.printed", **self.base, index=self._index, lines=lines)
