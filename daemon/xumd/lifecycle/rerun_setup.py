"""workspace.setup: run an active workspace's setup again (e.g. after `project.trust`, for a
workspace whose setup was skipped as untrusted).

Fenced like the other lifecycle operations: under the workspace's exclusive reservation, so no
archive, rename or remove runs meanwhile. It refuses anything but an active, uninterrupted
workspace whose checkout is its own (`invalid_state`, saying what to do instead): an archived
workspace's setup runs at unarchive; one mid-way through another operation is left to it
(`busy` from the reservation while that runs). It is not a structural change (the contract's
quiescence rule names rename, remove, archive and unarchive): the processes already running in
the workspace are neither waited for nor stopped, as a user running the setup in a terminal
would not; the reservation only keeps new ones from starting meanwhile (a spawn or a lease is
`busy`). The durable order is setup's own
(xumd.lifecycle.setup): `setup_status=running` committed before the script, the outcome after
it; a crash in between is settled at startup (recovery flags the setup failed, never leaves it
`running`), a shutdown that cuts the script commits and answers it `failed`.
"""

from __future__ import annotations

from xum_protocol.models.workspace import WorkspaceSetupResult

from xumd.base import logs
from xumd.base.requestcut import answer_if_cut, cut_reason
from xumd.lifecycle import setup
from xumd.lifecycle.context import Context, invalid_state
from xumd.lifecycle.scripts import ScriptOutcome

log = logs.get("xumd.lifecycle.rerun_setup")

_WHAT_INSTEAD = {
    "archived": "unarchive it (setup runs then)",
    "creating": "wait for its creation to finish",
    "archiving": "it is being archived",
    "restoring": "wait for its unarchive to finish (setup runs then)",
    "removing": "it is being removed",
}


async def rerun(ctx: Context, workspace_id: str) -> WorkspaceSetupResult:
    async with ctx.coord.exclusive(workspace_id, "setup") as ref:
        row = ctx.row(ref.id)
        if row.interrupted:
            raise invalid_state(
                row,
                f"workspace {row.name!r} is interrupted ({row.interrupted_reason}); keep it "
                "(`xum ws keep`) or remove it before running its setup",
                interrupted=True,
            )
        if row.state != "active":
            instead = _WHAT_INSTEAD.get(row.state, "only an active workspace's setup is run")
            raise invalid_state(
                row,
                f"workspace {row.name!r} is {row.state}; its setup is not run: {instead}",
            )
        if not ctx.owns_checkout(row):
            raise invalid_state(
                row,
                f"the checkout of {row.name!r} at {row.path} is missing or not its own; "
                "archive or remove the workspace instead",
                path=str(row.path),
            )
        previous = row.setup_status
        try:
            row, outcome = await setup.run(ctx, row)
        except BaseException:
            # Cut mid-way (a shutdown past its grace): never leave `running` behind for a live
            # daemon (a crash here is settled by recovery). Committed and answered as unarchive
            # does: a failed setup that says why. Synchronous: runs in a cancelled task.
            current = ctx.row(ref.id)
            if current.setup_status == "running":
                why = cut_reason(ctx.app.stopping)
                cut = ScriptOutcome(status="failed", error=f"setup was cut short: {why}")
                done = setup.activate(ctx, current, cut)  # it is active already: the outcome
                ctx.publish("workspace.updated", done)
                answer_if_cut(
                    lambda: WorkspaceSetupResult(workspace=ctx.info(done), setup=setup.result(cut)),
                    "workspace.setup",
                )
            raise
        ctx.publish("workspace.updated", row)
        log.info(
            "workspace.setup_rerun", workspace=row.id, previous=previous, status=outcome.status
        )
        return WorkspaceSetupResult(workspace=ctx.info(row), setup=setup.result(outcome))
