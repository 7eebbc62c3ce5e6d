"""workspace.remove: delete the checkout and the row (a tombstone remains); the branch and the
snapshot refs are kept. Uncommitted work that no snapshot holds, and ignored files matching
`preserve`, are `not_safe` unless `force`, which snapshots the work first and keeps the preserved
files in a kept copy (ROOT/archive/<ws-id>, reported in `kept`, listed by `workspace.strays`):
never silently dropped. An archived workspace's saved copy is kept the same way."""

from __future__ import annotations

from dataclasses import dataclass

from xum_protocol.errors import ErrorKind
from xum_protocol.models.cleanup import CleanupStatus
from xum_protocol.models.workspace import KeptInfo, WorkspaceRemoveResult

from xumd.base import faults, logs
from xumd.base.errors import XumError
from xumd.base.requestcut import answer_if_cut
from xumd.lifecycle import dirstore, preserved, rows, views
from xumd.lifecycle.context import Context, invalid_state, some
from xumd.lifecycle.onbytes import Account, refuse_unproven
from xumd.lifecycle.rows import ProjectRow, WorkspaceRow
from xumd.lifecycle.scripts import preserve_globs
from xumd.lifecycle.snapshot import Dropped, Snapshot, WorkState
from xumd.lifecycle.unarchive import unsaved_in_lingering

log = logs.get("xumd.lifecycle.remove")

REMOVE_AFTER_INTENT = faults.declare("workspace.remove.after_intent")
REMOVE_AFTER_SNAPSHOT = faults.declare("workspace.remove.after_snapshot")
REMOVE_AFTER_COMMIT = faults.declare("workspace.remove.after_commit")
HOLD = faults.declare(
    "workspace.remove.hold",
    "simulate: hold a remove after its intent (`removing`) committed, before the snapshot, "
    "until the test releases it (faults.FaultPoint.hold)",
    simulate=True,
)


@dataclass(frozen=True, slots=True)
class Checked:
    """A workspace that passed removal's checks under its caller's exclusive reservation."""

    row: WorkspaceRow
    project: ProjectRow
    live: bool
    owns: bool
    state: WorkState | None
    force: bool
    globs: list[str]
    proof: Account | None
    head_unheld: bool = False
    """With `force`: HEAD is detached at a commit no ref holds (the snapshot keeps it)."""
    """With `force`: what the snapshot cannot give back (kept as it is) and the index flags."""


async def remove(
    ctx: Context, workspace_id: str, force: bool = False, *, expect_state: str | None = None
) -> WorkspaceRemoveResult:
    """`expect_state`: refuse (`invalid_state`) unless the workspace is in that state under the
    reservation (gc removes what its plan saw archived, never one unarchived since)."""
    async with ctx.coord.exclusive(workspace_id, "remove") as ref:
        row = ctx.row(ref.id)
        if expect_state is not None and row.state != expect_state:
            raise invalid_state(
                row, f"workspace {row.name!r} is {row.state}, no longer {expect_state}"
            )
        return await remove_checked(ctx, await check(ctx, row, force))


async def check(ctx: Context, row: WorkspaceRow, force: bool) -> Checked:
    """Every refusal of a removal (state, holders, unsaved work), before any change: under
    the caller's exclusive reservation of `row`. `project.remove` checks all its workspaces
    this way before it removes any."""
    removable = row.state in ("active", "archived") or (row.state == "creating" and row.interrupted)
    if not removable:
        raise invalid_state(row, f"workspace {row.name!r} is {row.state}; wait for it to settle")
    project = ctx.project(row.project_id)
    live = row.state != "archived"
    owns = live and ctx.owns_checkout(row)
    if live:
        await ctx.quiescent(row, "remove")
    if row.state == "archived" and not force:
        # Its checkout may linger (cleanup pending) with work made after the archive: the
        # removal would let the cleanup trash it, so it is refused as an active one's is.
        lingering = await unsaved_in_lingering(ctx, row)
        if lingering:
            raise XumError(
                ErrorKind.NOT_SAFE,
                f"the archived checkout of {row.name!r} has work that its archive does not "
                f"hold: {some(lingering)}; move it away first, or remove with force (which "
                "discards it)",
                files=lingering[:100],
            )
    globs = preserve_globs(row.path, project.path) if owns else []
    state, proof, unheld = (
        await _check_safe(ctx, row, project, force, globs) if owns else (None, None, False)
    )
    return Checked(row, project, live, owns, state, force, globs, proof, unheld)


async def remove_checked(ctx: Context, checked: Checked) -> WorkspaceRemoveResult:
    """The removal itself, under the same reservation as `check`."""
    row, project, live, owns = checked.row, checked.project, checked.live, checked.owns
    state, force = checked.state, checked.force
    prior = row.state
    with ctx.store.transaction():
        row = ctx.update(row, state="removing")
        rows.record_removal_prior(ctx.store, row.id, prior)
    ctx.publish("workspace.state_changed", row)
    REMOVE_AFTER_INTENT()
    snap: Snapshot | None = None
    dropped = Dropped()
    try:
        await HOLD.hold()
        if owns:
            if state is not None and (state.dirty or checked.head_unheld):
                async with ctx.git.admin_lock(project.path):
                    snap = await ctx.snapshots.take(
                        row.path, row.id, row.incarnation, state=state, always=True
                    )
                REMOVE_AFTER_SNAPSHOT()
            if row.runtime == "worktree":
                # Preserved files are kept (like archive does), never dropped: a kept copy.
                dropped = await ctx.snapshots.report_and_preserve(
                    row.path, row.id, row.incarnation, checked.globs, checked.proof
                )
            elif force:
                dropped = await dirstore.save(ctx.app.paths.archive_store, row)
    except BaseException:
        # Nothing is deleted before the commit below: cut short (a shutdown) or failed, the
        # workspace is back as it was, and the answer (`shutting_down`, or the error) is true.
        ctx.roll_back(row, state=prior)
        raise
    with ctx.store.transaction():
        if snap is not None:
            row = ctx.update(row, snapshot_ref=snap.ref, snapshot_commit=snap.commit)
        if live:
            ctx.plan_cleanup(project, row, teardown=owns)
        rows.delete_workspace_with_tombstone(ctx.store, row)
    REMOVE_AFTER_COMMIT()
    ctx.app.events.publish(
        "workspace.removed", workspace_id=row.id, project_id=row.project_id, name=row.name
    )
    removed = row
    kept = _kept(ctx, row)

    def answer(cleanup: CleanupStatus) -> WorkspaceRemoveResult:
        return WorkspaceRemoveResult(
            workspace_id=removed.id,
            removed=True,
            branch=removed.branch,
            snapshot=views.snapshot_info(snap),
            dropped=views.dropped_info(dropped),
            cleanup=cleanup,
            kept=kept,
            raw=views.raw_info(checked.proof.raw if checked.proof else []),
        )

    # Removed from here on: a shutdown that cuts the cleanup short is answered with this
    # result (cleanup pending, and why), never `shutting_down`.
    answer_if_cut(lambda: answer(ctx.cleanup_as_cut(removed.id)), "workspace.remove")
    if live:
        cleanup = await ctx.run_cleanup(row.id)
    else:
        cleanup = ctx.cleanup.status(row.id) or CleanupStatus(
            status="not_needed", reason="the archived checkout was already cleaned up"
        )
    log.info("workspace.removed", workspace=row.id, cleanup=cleanup.status, kept=bool(kept))
    return answer(cleanup)


def _kept(ctx: Context, row: WorkspaceRow) -> KeptInfo | None:
    """Where the removed workspace's saved copy (preserved files; a directory's content) is
    kept: a `kept` stray from now on (workspace.strays, workspace.discard_kept)."""
    copy = preserved.load(ctx.app.paths.archive_store / row.id)
    if copy is None:
        return None
    return KeptInfo(path=str(copy.dir), files=copy.files, raw=list(copy.raw))


async def _check_safe(
    ctx: Context, row: WorkspaceRow, project: ProjectRow, force: bool, globs: list[str]
) -> tuple[WorkState | None, Account | None, bool]:
    """The checkout's uncommitted state (worktree) and what its snapshot cannot give back,
    after refusing `not_safe` what would be lost without `force`: work no snapshot holds,
    entries git's view misses (lifecycle/onbytes.py), ignored files the user asked to preserve
    (with `force` both are kept, not dropped), or a directory's files. What cannot be proven
    either way (an unreadable entry) is refused with `force` too."""
    if row.runtime != "worktree":
        content = dirstore.content_files(row)
        if content and not force:
            raise XumError(
                ErrorKind.NOT_SAFE,
                f"directory workspace {row.name!r} has files no snapshot holds; archive it "
                "or remove with force",
                files=content[:100],
            )
        return None, None, False
    if not force:
        await ctx.snapshots.refuse_in_progress(row.path, row.name, "remove")
    state = await ctx.snapshots.capture(row.path)
    unheld = not await ctx.snapshots.head_held(row.path, state.head)
    proof = await ctx.snapshots.prove(row.path, state.work_tree, project.path)
    refuse_unproven(row, proof, "remove", force=force)
    if force:
        return state, proof, unheld
    if unheld:
        raise XumError(
            ErrorKind.NOT_SAFE,
            f"workspace {row.name!r} has HEAD detached at {state.head[:12]}, which no branch, "
            "tag or remote ref holds: its commits would go with the checkout; put a branch on "
            "it, archive the workspace, or remove with force (which snapshots it)",
            head=state.head,
        )
    files: list[str] = []
    if state.dirty and not await ctx.snapshots.holds(row.path, state, row.snapshot_commit):
        files = await ctx.snapshots.dirty_files(row.path)
    unseen = [e.path for e in proof.raw if e.path not in files]
    keep = await ctx.snapshots.preserved_in(row.path, globs, proof.ignored)
    if files or unseen or keep:
        what = []
        if files:
            what.append(f"uncommitted work that no snapshot holds: {some(files)}")
        if unseen:
            what.append(
                "work git's view does not hold (a nested repository, a flagged or filtered "
                f"file, a path beyond git's reach, an empty directory): {some(unseen)}"
            )
        if keep:
            what.append(f"ignored files it is asked to preserve: {some(keep)}")
        raise XumError(
            ErrorKind.NOT_SAFE,
            f"workspace {row.name!r} has " + "; and ".join(what) + "; commit it, archive the "
            "workspace, or remove with force (which snapshots the work and keeps the preserved "
            "files in a kept copy)",
            files=files + unseen[: max(0, 100 - len(files))],
            raw=[e.as_dict() for e in proof.raw[:100]],
            preserved=keep[:100],
        )
    return state, None, False
