"""workspace.reallocate_ports: replace a workspace's ports by free ones, names and positions
kept. By default, the ports a process outside the workspace listens on now (what `workspace.get`
reports as `ports_taken`); or the ports the caller names, each of which must be the workspace's.
The workspace's running processes keep the environment they started with (the result says so);
its next setup, teardown and process get the new ports."""

from __future__ import annotations

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.workspace import WorkspaceReallocatePortsResult

from xumd.base.errors import XumError
from xumd.lifecycle import ports
from xumd.lifecycle.context import Context, invalid_state


async def reallocate_ports(
    ctx: Context, workspace_id: str, which: list[int] | None
) -> WorkspaceReallocatePortsResult:
    async with ctx.coord.exclusive(workspace_id, "reallocate ports") as ref:
        row = ctx.row(ref.id)
        if row.state not in ("active", "archived"):
            raise invalid_state(row, f"workspace {row.name!r} is {row.state}; try again later")
        held = ports.held(ctx.store, row.id)
        mine = [port for port, _name in held]
        if which is None:
            found = await anyio.to_thread.run_sync(ports.taken, held, row.id)
            which = [t.port for t in found]
        else:
            foreign = sorted({p for p in which if p not in mine})
            if foreign:
                raise XumError(
                    ErrorKind.INVALID_PARAMS,
                    f"port(s) {', '.join(map(str, foreign))} are not ports of workspace "
                    f"{row.name!r} (it holds {', '.join(map(str, mine)) or 'none'})",
                    ports=foreign,
                )
            which = sorted(set(which), key=mine.index)
        with ctx.store.transaction():
            changes = ports.reallocate(ctx.store, row.id, ctx.app.config.ports, which)
        if changes:
            ctx.publish("workspace.updated", row)
        return WorkspaceReallocatePortsResult(workspace=ctx.info(row), changes=changes)
