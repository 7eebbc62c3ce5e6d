"""workspace.keep: the user's **Keep** for an interrupted workspace (design section 3): clear the
flag; an interrupted `creating` row whose checkout is ours becomes `active` (its unfinished setup
is reported as failed)."""

from __future__ import annotations

import json
from typing import Any

from xum_protocol.models.workspace import WorkspaceResult

from xumd.lifecycle.context import Context, invalid_state


async def keep(ctx: Context, workspace_id: str) -> WorkspaceResult:
    async with ctx.coord.exclusive(workspace_id, "keep") as ref:
        row = ctx.row(ref.id)
        if not row.interrupted:
            raise invalid_state(row, f"workspace {row.name!r} is not interrupted; nothing to keep")
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
