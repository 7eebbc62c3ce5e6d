"""workspace.keep: the user's **Keep** for an interrupted workspace (docs/ARCHITECTURE.md, "The
contract"): clear the flag; an interrupted `creating` row whose checkout is ours becomes `active`
(its unfinished setup is reported as failed). A row with a kept rename journal (a rename whose undo
failed) is first settled by recovery's own logic (the `rename_settler` seam), as a restart would
settle it."""

from __future__ import annotations

import json
from typing import Any

from xum_protocol.models.workspace import WorkspaceResult

from xumd.lifecycle import rows
from xumd.lifecycle.context import Context, invalid_state
from xumd.lifecycle.rows import WorkspaceRow


async def keep(ctx: Context, workspace_id: str) -> WorkspaceResult:
    async with ctx.coord.exclusive(workspace_id, "keep") as ref:
        row = ctx.row(ref.id)
        if not row.interrupted:
            raise invalid_state(row, f"workspace {row.name!r} is not interrupted; nothing to keep")
        if _has_journal(ctx, row.id):
            settled = await _settle_rename(ctx, row)
            if settled is not None:
                return settled
            row = ctx.row(ref.id)
        fields: dict[str, Any] = {"interrupted": 0, "interrupted_reason": None}
        if row.state == "creating":
            if not ctx.owns_checkout(row):
                raise invalid_state(
                    row,
                    f"the checkout of {row.name!r} is missing or not ours; remove it instead",
                    path=str(row.path),
                )
            st = row.path.stat()
            fields.update(state="active", dev=st.st_dev, ino=st.st_ino)
            if row.setup_status in ("pending", "running"):
                fields.update(
                    setup_status="failed",
                    setup_output=json.dumps({"error": "setup was interrupted"}),
                )
        with ctx.store.transaction():
            row = ctx.update(row, **fields)
        ctx.publish("workspace.state_changed", row)
        return WorkspaceResult(workspace=ctx.info(row))


def _has_journal(ctx: Context, workspace_id: str) -> bool:
    return rows.has_rename_journal(ctx.store, workspace_id)


async def _settle_rename(ctx: Context, row: WorkspaceRow) -> WorkspaceResult | None:
    """Settle the kept journal (an unprovable one raises, leaving journal and flag). The row
    that settles with a new problem (a branch git would not rename) stays flagged with it, and
    is the answer: the user sees why; None: settled cleanly, the flag is cleared as usual."""
    settler = ctx.hooks.rename_settler
    if settler is None:
        raise invalid_state(
            row,
            f"the interrupted rename of {row.name!r} cannot be settled by this daemon (no "
            "recovery); restart the daemon so recovery settles it",
        )
    problem = await settler(row.id)
    if problem is None:
        return None
    return WorkspaceResult(workspace=ctx.info(ctx.row(row.id)))
