"""workspace.remove: delete the checkout and the row (a tombstone remains); the branch and the
snapshot refs are kept. Uncommitted work that no snapshot holds, and ignored files matching
`preserve`, are `not_safe` unless `force`, which snapshots the work first and keeps the preserved
files in a kept copy (ROOT/archive/<ws-id>, reported in `kept`, listed by `workspace.strays`):
never silently dropped. An archived workspace's saved copy is kept the same way."""

from __future__ import annotations

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.cleanup import CleanupStatus
from xum_protocol.models.workspace import KeptInfo, WorkspaceRemoveResult

from xumd import faults, logs
from xumd.errors import XumError
from xumd.lifecycle import dirstore, preserved, rows, views
from xumd.lifecycle.context import Context, invalid_state, some
from xumd.lifecycle.rows import WorkspaceRow
from xumd.lifecycle.scripts import preserve_globs
from xumd.lifecycle.snapshot import Dropped, Snapshot, WorkState

log = logs.get("xumd.lifecycle.remove")

REMOVE_AFTER_INTENT = faults.declare("workspace.remove.after_intent")
REMOVE_AFTER_SNAPSHOT = faults.declare("workspace.remove.after_snapshot")
REMOVE_AFTER_COMMIT = faults.declare("workspace.remove.after_commit")


async def remove(ctx: Context, workspace_id: str, force: bool = False) -> WorkspaceRemoveResult:
    async with ctx.coord.exclusive(workspace_id, "remove") as ref:
        row = ctx.row(ref.id)
        removable = row.state in ("active", "archived") or (
            row.state == "creating" and row.interrupted
        )
        if not removable:
            raise invalid_state(
                row, f"workspace {row.name!r} is {row.state}; wait for it to settle"
            )
        project = ctx.project(row.project_id)
        live = row.state != "archived"
        owns = live and ctx.owns_checkout(row)
        if live:
            await ctx.quiescent(row, "remove")
        globs = preserve_globs(row.path, project.path) if owns else []
        state = await _check_safe(ctx, row, force, globs) if owns else None
        with ctx.store.transaction():
            row = ctx.update(row, state="removing")
        ctx.publish("workspace.state_changed", row)
        REMOVE_AFTER_INTENT()
        snap: Snapshot | None = None
        dropped = Dropped()
        if owns:
            if state is not None and state.dirty:
                async with ctx.git.admin_lock(project.path):
                    snap = await ctx.snapshots.take(row.path, row.id, row.incarnation, state=state)
                REMOVE_AFTER_SNAPSHOT()
            if row.runtime == "worktree":
                # Preserved files are kept (like archive does), never dropped: a kept copy.
                dropped = await ctx.snapshots.report_and_preserve(
                    row.path, row.id, row.incarnation, globs
                )
            elif force:
                dropped = await dirstore.save(ctx.app.paths.archive_store, row)
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
        if live:
            cleanup = await ctx.run_cleanup(row.id)
        else:
            cleanup = ctx.cleanup.status(row.id) or CleanupStatus(
                status="not_needed", reason="the archived checkout was already cleaned up"
            )
        kept = _kept(ctx, row)
        log.info("workspace.removed", workspace=row.id, cleanup=cleanup.status, kept=bool(kept))
        return WorkspaceRemoveResult(
            workspace_id=row.id,
            removed=True,
            branch=row.branch,
            snapshot=views.snapshot_info(snap),
            dropped=views.dropped_info(dropped),
            cleanup=cleanup,
            kept=kept,
        )


def _kept(ctx: Context, row: WorkspaceRow) -> KeptInfo | None:
    """Where the removed workspace's saved copy (preserved files; a directory's content) is
    kept: a `kept` stray from now on (workspace.strays, workspace.discard_kept)."""
    copy = preserved.load(ctx.app.paths.archive_store / row.id)
    if copy is None:
        return None
    return KeptInfo(path=str(copy.dir), files=copy.files)


async def _check_safe(
    ctx: Context, row: WorkspaceRow, force: bool, globs: list[str]
) -> WorkState | None:
    """The checkout's uncommitted state (worktree), after refusing `not_safe` what would be lost
    without `force`: work no snapshot holds, ignored files the user asked to preserve (with
    `force` they are kept, not dropped), or a directory's files."""
    if row.runtime != "worktree":
        content = dirstore.content_files(row)
        if content and not force:
            raise XumError(
                ErrorKind.NOT_SAFE,
                f"directory workspace {row.name!r} has files no snapshot holds; archive it "
                "or remove with force",
                files=content[:100],
            )
        return None
    state = await ctx.snapshots.capture(row.path)
    if force:
        return state
    files: list[str] = []
    if state.dirty and not await ctx.snapshots.holds(row.path, state, row.snapshot_commit):
        files = await ctx.snapshots.dirty_files(row.path)
    keep: list[str] = []
    if globs:
        entries = await ctx.snapshots.ignored(row.path)
        keep = await anyio.to_thread.run_sync(
            ctx.snapshots.preserved_files, row.path, entries, globs
        )
    if files or keep:
        what = []
        if files:
            what.append(f"uncommitted work that no snapshot holds: {some(files)}")
        if keep:
            what.append(f"ignored files it is asked to preserve: {some(keep)}")
        raise XumError(
            ErrorKind.NOT_SAFE,
            f"workspace {row.name!r} has " + "; and ".join(what) + "; commit it, archive the "
            "workspace, or remove with force (which snapshots the work and keeps the preserved "
            "files in a kept copy)",
            files=files,
            preserved=keep[:100],
        )
    return state
