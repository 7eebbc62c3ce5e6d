"""The setup phase of create and unarchive: `setup_status=running` committed before the script
runs (so a crash mid-setup is visible at startup), the outcome committed as soon as the script
returns (so a crash after it is not mistaken for an unfinished setup: recovery's
`SETUP_FINISHED`), then the row made `active`."""

from __future__ import annotations

import json
from typing import Any

from xum_protocol.models.workspace import ScriptResult

from xumd import faults, logs
from xumd.lifecycle.context import Context
from xumd.lifecycle.progress import ScriptEvents
from xumd.lifecycle.rows import WorkspaceRow
from xumd.lifecycle.scripts import ScriptOutcome

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
