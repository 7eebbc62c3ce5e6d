"""workspace.archive: (1) snapshot the uncommitted work and preserve chosen ignored files,
(2) the logical archive (`archived`) committed together with the cleanup obligations, (3) the
cleanup attempted now and reported as it is (`completed`, `pending`, ...), never better."""

from __future__ import annotations

import os

from xum_protocol.errors import ErrorKind
from xum_protocol.models.cleanup import CleanupStatus
from xum_protocol.models.workspace import WorkspaceArchiveResult

from xumd.base import faults, requestkey
from xumd.base.errors import XumError
from xumd.base.requestcut import answer_if_cut
from xumd.checkouts.marker import WorkspaceRef
from xumd.lifecycle import bigrepo, dirstore, rows, sparse_cone, views
from xumd.lifecycle.context import Context, invalid_state
from xumd.lifecycle.hooks import holders_text
from xumd.lifecycle.materialise import clear_stale_locks
from xumd.lifecycle.onbytes import RawEntry, refuse_unproven
from xumd.lifecycle.rows import ProjectRow, WorkspaceRow
from xumd.lifecycle.scripts import preserve_globs
from xumd.lifecycle.snapshot import Dropped, Snapshot

ARCHIVE_AFTER_INTENT = faults.declare("workspace.archive.after_intent")
ARCHIVE_AFTER_SNAPSHOT = faults.declare("workspace.archive.after_snapshot")
ARCHIVE_AFTER_COMMIT = faults.declare("workspace.archive.after_commit")
HOLD = faults.declare(
    "workspace.archive.hold",
    "simulate: hold an archive after its intent (`archiving`) committed, before the snapshot, "
    "until the test releases it (faults.FaultPoint.hold)",
    simulate=True,
)


async def archive(ctx: Context, workspace_id: str, stop: bool = False) -> WorkspaceArchiveResult:
    async with ctx.coord.exclusive(workspace_id, "archive") as ref:
        row = ctx.row(ref.id)
        if row.state != "active":
            raise invalid_state(
                row, f"workspace {row.name!r} is {row.state}; only an active workspace is archived"
            )
        stopped = await _stop(ctx, ref, row) if stop else []
        try:
            await ctx.quiescent(row, "archive")
        except XumError as exc:
            if stopped:
                # The stop is done and stays done: a refusal says so (no false answer).
                exc.message += "; the daemon's own processes in it were stopped first"
                exc.data["stopped"] = stopped
            raise
        project = ctx.project(row.project_id)
        with ctx.store.transaction():
            row = ctx.update(row, state="archiving")
        ctx.publish("workspace.state_changed", row)
        ARCHIVE_AFTER_INTENT()
        try:
            await HOLD.hold()
            snap, dropped, raw = await _save_work(ctx, project, row)
            # The checkout's own cone, for its unarchive to re-apply (lifecycle/sparse_cone.py).
            owned = row.runtime == "worktree" and ctx.owns_checkout(row)
            sparse = await bigrepo.sparse_patterns(ctx.git, row.path) if owned else None
        except BaseException:
            ctx.roll_back(row, state="active")
            raise
        ARCHIVE_AFTER_SNAPSHOT()
        with ctx.store.transaction():
            row = ctx.update(row, state="archived", **_snapshot_fields(snap))
            sparse_cone.record(ctx.store, row.id, sparse)
            ctx.plan_cleanup(project, row, teardown=True)
            # A keyed archive's key is recorded with the archive itself (rpc/requestkeys.py).
            requestkey.bind_target(row.id, "workspace.archive")
        ctx.publish("workspace.state_changed", row)
        ARCHIVE_AFTER_COMMIT()
        archived = row

        def answer(status: CleanupStatus) -> WorkspaceArchiveResult:
            current = rows.get_workspace(ctx.store, archived.id) or archived
            return WorkspaceArchiveResult(
                workspace=ctx.info(current),
                snapshot=views.snapshot_info(snap),
                dropped=views.dropped_info(dropped),
                cleanup=status,
                raw=views.raw_info(raw),
                stopped=stopped,
            )

        # Archived from here on: a shutdown that cuts the cleanup short is answered with this
        # result (cleanup pending, and why), never `shutting_down`.
        answer_if_cut(lambda: answer(ctx.cleanup_as_cut(archived.id)), "workspace.archive")
        return answer(await ctx.run_cleanup(row.id))


def _snapshot_fields(snap: Snapshot | None) -> dict[str, str]:
    return {"snapshot_ref": snap.ref, "snapshot_commit": snap.commit} if snap else {}


async def _stop(ctx: Context, ref: WorkspaceRef, row: WorkspaceRow) -> list[str]:
    """Stop the daemon's own processes in the workspace first (a user-visible step); the ids
    of the processes stopped."""
    stopped, left = await ctx.hooks.stop_all(ref, ctx.app.config.stop_grace_s + 5.0)
    if left:
        raise XumError(
            ErrorKind.BUSY,
            f"cannot archive {row.name!r}: could not stop " + holders_text(left),
            holders=[h.as_dict() for h in left],
        )
    return stopped


async def _save_work(
    ctx: Context, project: ProjectRow, row: WorkspaceRow
) -> tuple[Snapshot | None, Dropped, list[RawEntry]]:
    """Snapshot uncommitted work, prove on the bytes what the snapshot gives back, and save
    what it does not (and the chosen ignored files) as it is, touching nothing."""
    if not ctx.owns_checkout(row):
        if os.path.lexists(row.path):
            raise XumError(
                ErrorKind.CONFLICT,
                f"{row.path} does not carry the marker of {row.id}; refusing to snapshot it",
                path=str(row.path),
            )
        return None, Dropped(), []  # deleted by hand: nothing left to save
    globs = preserve_globs(row.path, project.path)
    if row.runtime == "directory":
        return None, await dirstore.save(ctx.app.paths.archive_store, row), []
    async with ctx.git.admin_lock(project.path):
        await clear_stale_locks(ctx.git, project.path)
        await ctx.snapshots.refuse_in_progress(row.path, row.name, "archive")
        state = await ctx.snapshots.capture(row.path)
        held = await ctx.snapshots.head_held(row.path, state.head)
        snap = await ctx.snapshots.take(
            row.path, row.id, row.incarnation, state=state, always=not held
        )
    proof = await ctx.snapshots.prove(row.path, state.work_tree, project.path)
    refuse_unproven(row, proof, "archive")
    dropped = await ctx.snapshots.report_and_preserve(
        row.path, row.id, row.incarnation, globs, proof
    )
    return snap, dropped, proof.raw
