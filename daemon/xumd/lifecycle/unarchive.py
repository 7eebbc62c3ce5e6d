"""workspace.unarchive: settle the archive's pending cleanup, then recreate the checkout at its
path (new incarnation, `restoring` committed first), restore the snapshot exactly, place the
preserved files, run setup, put back any preserved file setup overwrote (the user's copy wins),
`active`, and only then verify the preserved files in place and delete their saved copy
(lifecycle/preserved.py). A failure before setup undoes the new checkout and puts the archived
row back."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.workspace import RestoredInfo, SnapshotInfo, WorkspaceUnarchiveResult

from xumd.base import faults, logs
from xumd.base.errors import XumError
from xumd.base.requestcut import answer_if_cut, cut_reason
from xumd.cleanup.obligations import ObligationRow
from xumd.lifecycle import (
    bigrepo,
    capacity,
    createconfig,
    dirstore,
    ids,
    materialise,
    onbytes,
    ports,
    preserved,
    rows,
    setup,
    sparse_cone,
)
from xumd.lifecycle.context import (
    UNDO_DEADLINE_S,
    Context,
    invalid_state,
    is_rows_checkout,
    some,
)
from xumd.lifecycle.create import seed_checkout
from xumd.lifecycle.hooks import busy_message, mount_holders
from xumd.lifecycle.rows import ProjectRow, WorkspaceRow
from xumd.lifecycle.scripts import ScriptOutcome, preserve_globs
from xumd.lifecycle.snapshot import Snapshotter
from xumd.store import Store
from xumd.system import rawcopy

log = logs.get("xumd.lifecycle.unarchive")

UNARCHIVE_AFTER_INTENT = faults.declare("workspace.unarchive.after_intent")
UNARCHIVE_AFTER_CHECKOUT = faults.declare("workspace.unarchive.after_checkout")
UNARCHIVE_AFTER_RESTORE = faults.declare("workspace.unarchive.after_restore")
UNARCHIVE_AFTER_SETUP = faults.declare("workspace.unarchive.after_setup")
UNARCHIVE_AFTER_PRESERVED = faults.declare(
    "workspace.unarchive.after_preserved",
    "preserved files put back over what setup wrote; the row is not `active` yet",
)
UNARCHIVE_AFTER_ACTIVATE = faults.declare(
    "workspace.unarchive.after_activate",
    "`active` committed; the saved copy of preserved files is not verified and deleted yet",
)
HOLD = faults.declare(
    "workspace.unarchive.hold",
    "simulate: hold an unarchive after its checkout is recreated, before the snapshot is "
    "restored, until the test releases it (faults.FaultPoint.hold)",
    simulate=True,
)
UNDO_AFTER_DISCARD = faults.declare(
    "workspace.unarchive.undo.after_discard",
    "a failed unarchive took its new checkout back; the row is still `restoring`",
)


async def unarchive(ctx: Context, workspace_id: str) -> WorkspaceUnarchiveResult:
    async with ctx.coord.exclusive(workspace_id, "unarchive") as ref:
        row = ctx.row(ref.id)
        if row.state != "archived":
            raise invalid_state(
                row, f"workspace {row.name!r} is {row.state}; only an archived one is unarchived"
            )
        project = ctx.project(row.project_id)
        await _settle_old_checkout(ctx, row)
        _check_path_free(ctx, row)
        wanted = createconfig.load(project.path)
        room = await _room(ctx, project, row, wanted)
        old = row
        with ctx.store.transaction():
            row = ctx.update(
                row, state="restoring", incarnation=ids.new_incarnation(), dev=None, ino=None
            )
            capacity.check_count(ctx.store, project.id, ctx.app.config.gc.max_workspaces)
            # Its ports were kept while archived; one taken meanwhile is replaced (reported).
            replaced = ports.recheck(ctx.store, row.id, ctx.app.config.ports)
        ctx.publish("workspace.state_changed", row)
        UNARCHIVE_AFTER_INTENT()
        made = False
        try:
            async with ctx.coord.directories.directory(row.path, label=f"unarchive {row.id}"):
                _check_path_free(ctx, row)
                if row.runtime == "worktree":
                    # Before `made`: a refusal here must not run the undo's discard, which
                    # would drop whatever entry registers the (missing) path.
                    dropped = await materialise.drop_stale_admin_entry(ctx.git, project.path, row)
                    if dropped:
                        log.info("workspace.stale_admin_entry_dropped", workspace=row.id)
                row.path.parent.mkdir(parents=True, exist_ok=True)
                made = True
                await _recreate(ctx, project, row)
            UNARCHIVE_AFTER_CHECKOUT()
            await HOLD.hold()
            restored = await _restore(ctx, row)
            if row.runtime == "worktree":
                restored = await _resparsify(ctx, project, row, restored)
                # As create does: from the main checkout's copies, no network (bigrepo.py).
                subs = await bigrepo.init_submodules(ctx.git, project.path, row.path)
                restored = restored.model_copy(update={"submodules": subs})
                saved = preserved.load(ctx.app.paths.archive_store / row.id)
                if saved is not None and saved.flags:
                    await onbytes.reflag(ctx.git, row.path, saved.flags)
            # What the archive did not preserve, copied again from the main checkout (an
            # entry the snapshot or the preserved files restored is left as it is).
            copied = await seed_checkout(ctx, project, row, wanted.copy)
            UNARCHIVE_AFTER_RESTORE()
            st = row.path.stat()
            with ctx.store.transaction():
                row = ctx.update(row, dev=st.st_dev, ino=st.st_ino)
        except BaseException:
            with anyio.CancelScope(shield=True), anyio.move_on_after(UNDO_DEADLINE_S):
                await _undo(ctx, project, old, row, made)
            raise
        # Restored (identity recorded: recovery rolls forward from here). A shutdown that cuts
        # the setup short makes the workspace active with its setup `failed` and says so, as a
        # setup that fails does, instead of undoing a restore that went through.
        try:
            row, outcome = await setup.run(ctx, row)
        except anyio.get_cancelled_exc_class():
            why = cut_reason(ctx.app.stopping)
            cut = ScriptOutcome(status="failed", error=f"setup was cut short: {why}")
            done = setup.activate(ctx, row, cut)
            ctx.publish("workspace.state_changed", done)
            answer_if_cut(
                lambda: WorkspaceUnarchiveResult(
                    workspace=ctx.info(done),
                    restored=restored,
                    setup=setup.result(cut),
                    ignored_copy=copied,
                    ports_replaced=replaced,
                    evicted=room.evicted,
                ),
                "workspace.unarchive",
            )
            raise
        UNARCHIVE_AFTER_SETUP()
        copy = _saved_copy(ctx, row)
        if copy is not None:
            restored = await _settle_preserved(copy, row, restored)
        UNARCHIVE_AFTER_PRESERVED()
        row = setup.activate(ctx, row, outcome)
        ctx.publish("workspace.state_changed", row)
        UNARCHIVE_AFTER_ACTIVATE()
        if copy is not None:
            # Only now (restored bytes in place, the workspace active) may the copy go.
            try:
                finished = await anyio.to_thread.run_sync(preserved.finish, copy, row.path)
            except OSError as exc:
                # `active` is committed: answer it, with the copy left where it is (the next
                # start settles it).
                log.warning("workspace.preserved_finish_failed", workspace=row.id, error=str(exc))
                finished = preserved.Finished(kept_at=str(copy.dir))
            restored = restored.model_copy(
                update={"kept_at": finished.kept_at, "unverified": finished.unverified}
            )
        if ctx.app.config.gc.budgeted():
            ctx.room.created()  # the budget checked in the background, after what this wrote
        return WorkspaceUnarchiveResult(
            workspace=ctx.info(row),
            restored=restored,
            setup=setup.result(outcome),
            ignored_copy=copied,
            ports_replaced=replaced,
            evicted=room.evicted,
        )


def _saved_copy(ctx: Context, row: WorkspaceRow) -> preserved.SavedCopy | None:
    """The archive's saved copy (preserved files; a directory's content), if there is one."""
    copy = preserved.load(ctx.app.paths.archive_store / row.id)
    if copy is None or copy.incarnation == row.incarnation:
        return None  # (the same incarnation would be a copy of this checkout: nothing to settle)
    return copy


async def _settle_preserved(
    copy: preserved.SavedCopy, row: WorkspaceRow, restored: RestoredInfo
) -> RestoredInfo:
    """After setup: the user's copy wins over whatever setup wrote at a preserved path."""
    try:
        settled = await anyio.to_thread.run_sync(preserved.settle, copy, row.path)
    except OSError as exc:
        # Reported; the copy is then kept (it cannot verify), never lost.
        log.warning("workspace.preserved_settle_failed", workspace=row.id, error=str(exc))
        return restored
    if settled.replaced:
        log.info("workspace.preserved_replaced", workspace=row.id, files=len(settled.replaced))
    return restored.model_copy(update={"replaced": settled.replaced})


async def _settle_old_checkout(ctx: Context, row: WorkspaceRow) -> None:
    """Run the archive's pending cleanup now (forced), before the new incarnation exists: it
    frees the path and drops the old incarnation's locked git admin entry, without which
    `git worktree add` refuses the path ("missing but locked"). The cleanup takes the directory
    exclusion itself, so this runs before unarchive takes it. An old checkout that gained work
    after the archive (which the snapshot, or the directory runtime's archive copy, does not
    hold) is refused first: trashing it would lose that work."""
    status = ctx.cleanup.status(row.id)
    if status is None or status.status != "pending":
        return
    # The checkout the cleanup would trash is where its obligations say: a rename of the
    # archived workspace moved only the row's path, not the lingering checkout.
    paths = {row.path} | {
        Path(ob.path)
        for ob in ctx.cleanup.obligations.pending_for_workspace(row.id)
        if ob.incarnation == row.incarnation and ob.kind != "reclaim"
    }
    project = ctx.project(row.project_id)
    for path in sorted(paths):
        await _refuse_mounted(replace(row, path=path))
        await _refuse_unsaved(ctx, replace(row, path=path), project)
    await ctx.run_cleanup(row.id, force=True)


async def _refuse_mounted(row: WorkspaceRow) -> None:
    """A mount in the lingering checkout: its trash step waits for it, and its files are not
    the checkout's work (they would otherwise be reported as unsaved). Busy, naming it."""
    holders = await mount_holders(row.ref())
    if holders:
        raise XumError(
            ErrorKind.BUSY,
            f"cannot unarchive {row.name!r}: its archived checkout at {row.path} is "
            + busy_message(holders),
            holders=[h.as_dict() for h in holders],
        )


@dataclass(frozen=True, slots=True)
class ArchiveComparison:
    """What comparing a lingering checkout with its archive reads: the store, the snapshotter
    and the archive store, not the workspace service. So the composition root builds it before
    the cleanup service (whose trash step asks it: `cleanup.steps.UnsavedWork`) and the
    workspace service (which needs that cleanup service) alike."""

    store: Store
    snapshots: Snapshotter
    archive_store: Path

    @staticmethod
    def of(ctx: Context) -> ArchiveComparison:
        return ArchiveComparison(ctx.store, ctx.snapshots, ctx.app.paths.archive_store)

    async def unsaved_files(self, ob: ObligationRow) -> list[str]:
        return await unsaved_before_trash(self, ob.workspace_id, ob.incarnation, Path(ob.path))


async def unsaved_in_checkout(
    cmp: ArchiveComparison, row: WorkspaceRow, project: ProjectRow
) -> list[str]:
    """Files of the lingering checkout at `row.path` that the archive does not hold (worktree
    work vs the snapshot commit, preserved files vs their saved copy, a directory's files vs the
    archive store). Empty when the path is not this incarnation's checkout."""
    if not is_rows_checkout(row):
        return []
    if row.runtime == "worktree":
        state = await cmp.snapshots.capture(row.path)
        files = await cmp.snapshots.unsaved_files(row.path, state, row.snapshot_commit)
        files += await _unsaved_preserved(cmp, row, project)
        files += await _unsaved_raw(cmp, row, project, state.work_tree)
        return files
    return await dirstore.unsaved_files(cmp.archive_store, row)


async def unsaved_before_trash(
    cmp: ArchiveComparison, workspace_id: str, incarnation: str, path: Path
) -> list[str]:
    """The cleanup's check before it trashes a checkout: only an ARCHIVED workspace's own
    checkout is compared with its archive (a remove is explicit and snapshots first; a
    superseded or tombstoned one is not ours to judge here: the fence decides)."""
    row = rows.get_workspace(cmp.store, workspace_id)
    if row is None or row.state != "archived" or row.incarnation != incarnation:
        return []
    project = rows.get_project(cmp.store, row.project_id)
    if project is None:
        return []
    return await unsaved_in_checkout(cmp, replace(row, path=path), project)


async def unsaved_in_lingering(ctx: Context, row: WorkspaceRow) -> list[str]:
    """The files of an archived workspace's lingering checkouts (its trash step still pending)
    that its archive does not hold: what removing it would lose."""
    paths = {
        Path(ob.path)
        for ob in ctx.cleanup.obligations.pending_for_workspace(row.id)
        if ob.incarnation == row.incarnation and ob.kind == "trash"
    }
    if not paths:
        return []
    project = ctx.project(row.project_id)
    files: list[str] = []
    cmp = ArchiveComparison.of(ctx)
    for path in sorted(paths):
        files += await unsaved_in_checkout(cmp, replace(row, path=path), project)
    return files


async def _refuse_unsaved(ctx: Context, row: WorkspaceRow, project: ProjectRow) -> None:
    files = await unsaved_in_checkout(ArchiveComparison.of(ctx), row, project)
    if files:
        raise XumError(
            ErrorKind.NOT_SAFE,
            f"the archived checkout of {row.name!r} at {row.path} has work that its "
            f"archive does not hold: {some(files)}; commit it or move it away first",
            files=files[:100],
            path=str(row.path),
        )


async def _unsaved_preserved(
    cmp: ArchiveComparison, row: WorkspaceRow, project: ProjectRow
) -> list[str]:
    """Preserved (ignored) files of the lingering checkout that its saved copy does not hold
    byte for byte: changed or made since the archive. Trashing the checkout would lose them."""
    keep = await cmp.snapshots.preserved_in(row.path, preserve_globs(row.path, project.path))
    if not keep:
        return []
    copy = preserved.load(cmp.archive_store / row.id)
    return [
        rel
        for rel in keep
        if copy is None
        or rel not in copy.files
        or not preserved.same_file(copy.files_root / rel, row.path / rel)
    ]


async def _unsaved_raw(
    cmp: ArchiveComparison, row: WorkspaceRow, project: ProjectRow, tree: str
) -> list[str]:
    """Entries of the lingering checkout that git's view does not give back (a nested
    repository, a flagged or filtered file, a path beyond git's reach: lifecycle/onbytes.py)
    and that the archive's raw copy does not hold byte for byte; an entry nothing can be
    proven about counts too."""
    proof = await cmp.snapshots.prove(row.path, tree, project.path)
    if not proof.raw and not proof.held_back(force=False):
        return []
    copy = preserved.load(cmp.archive_store / row.id)
    held = set(copy.raw) if copy is not None and copy.incarnation == row.incarnation else set()

    def unheld() -> list[str]:
        assert copy is not None or not held
        return [
            e.path
            for e in proof.raw
            if e.path not in held
            or copy is None
            or not rawcopy.same(copy.raw_root, row.path, e.path)
        ]

    files = await anyio.to_thread.run_sync(unheld)
    return files + [path for path, _why in proof.held_back(force=False)]


def _check_path_free(ctx: Context, row: WorkspaceRow) -> None:
    if not os.path.lexists(row.path):
        return
    status = ctx.cleanup.status(row.id)
    if status is not None and status.status in ("pending", "failed"):
        why = status.last_error or status.reason
        raise XumError(
            ErrorKind.CLEANUP_PENDING,
            f"{row.path} still holds the archived checkout (cleanup {status.status}"
            + (f": {why}" if why else "")
            + ")",
            cleanup=status.model_dump(mode="json"),
            path=str(row.path),
        )
    raise XumError(ErrorKind.CONFLICT, f"{row.path} exists; move it away first", path=str(row.path))


async def _room(
    ctx: Context, project: ProjectRow, row: WorkspaceRow, wanted: createconfig.CreateSettings
) -> capacity.Made:
    """While a disk budget is set, the checkout it is about to make is checked as a create's
    is (lifecycle/capacity.py): the free space, `max_bytes` and `max_workspaces`, room made by
    gc first, refused before the row leaves `archived` otherwise. The estimate is the tree the
    restore writes: the snapshot's work tree, else the branch's."""
    gc = ctx.app.config.gc
    if not gc.budgeted():
        return capacity.Made()
    need: int | None = None
    if row.runtime == "worktree" and project.kind == "git" and capacity.sizes(gc):
        commit = row.snapshot_commit
        if commit is None and row.branch is not None:
            tip = await ctx.git.run(
                project.path,
                "rev-parse",
                "--verify",
                "--quiet",
                f"refs/heads/{row.branch}^{{commit}}",
                check=False,
            )
            commit = tip.output.text().strip() if tip.ok else None
        need = await capacity.tree_bytes(ctx.git, project.path, commit) if commit else None
        if need is not None:
            cap = ctx.app.config.create.copy_max_bytes
            need += await capacity.copy_bytes(ctx.git, project.path, wanted.copy, cap)
    wants = capacity.Need(row.path.parent, need, project.id, row.name)
    return await capacity.ensure(wants, gc, f"workspace {row.name!r} again", ctx.room, ctx.store)


async def _recreate(ctx: Context, project: ProjectRow, row: WorkspaceRow) -> None:
    if row.runtime == "directory":
        materialise.make_directory(row)
        return
    assert row.branch is not None
    exists = await ctx.git.run(
        project.path, "rev-parse", "--verify", "--quiet", f"refs/heads/{row.branch}", check=False
    )
    if exists.ok:
        await materialise.add_worktree(ctx.git, project.path, row, row.branch, None)
    elif row.snapshot_commit:
        # The branch was deleted by hand: bring it back where the snapshot was taken.
        await materialise.add_worktree(
            ctx.git, project.path, row, row.branch, f"{row.snapshot_commit}^1"
        )
    else:
        raise XumError(
            ErrorKind.NOT_FOUND,
            f"branch {row.branch!r} no longer exists and no snapshot holds its work",
            branch=row.branch,
        )


async def _restore(ctx: Context, row: WorkspaceRow) -> RestoredInfo:
    if row.runtime == "directory":
        return await dirstore.restore(ctx.app.paths.archive_store, row)
    snap: SnapshotInfo | None = None
    if row.snapshot_commit and row.snapshot_ref:
        files = await ctx.snapshots.restore(row.path, row.snapshot_commit)
        snap = SnapshotInfo(ref=row.snapshot_ref, commit=row.snapshot_commit, files=files)
    raw = await anyio.to_thread.run_sync(ctx.snapshots.restore_raw, row.id, row.path)
    if raw.problems:
        # The saved copy stays (its verification after setup fails, so it is kept and
        # reported in `unverified`): nothing is lost, and the answer says where it is.
        log.warning("workspace.raw_not_placed", workspace=row.id, paths=raw.problems[:20])
    preserved = ctx.snapshots.restore_preserved(row.id, row.path)
    return RestoredInfo(snapshot=snap, preserved=preserved, raw=raw.placed)


async def _resparsify(
    ctx: Context, project: ProjectRow, row: WorkspaceRow, restored: RestoredInfo
) -> RestoredInfo:
    """The cone recorded at archive, re-applied over the restored files without dropping any
    that carries work (lifecycle/sparse_cone.py)."""
    sparse = sparse_cone.recorded(ctx.store, row.id)
    if sparse is None:
        await sparse_cone.unsparse(ctx.git, project.path, row.path)
        return restored
    applied, kept = await sparse_cone.reapply(
        ctx.git, project.path, row.path, sparse, restored.preserved
    )
    return restored.model_copy(update={"sparse": applied, "sparse_kept": kept})


async def _undo(
    ctx: Context, project: ProjectRow, old: WorkspaceRow, row: WorkspaceRow, made: bool
) -> None:
    log.warning("workspace.unarchive_undo", workspace=row.id)
    if made:
        await materialise.discard(ctx.git, project.path, row)
        UNDO_AFTER_DISCARD()
    ctx.roll_back(row, state="archived", incarnation=old.incarnation, dev=old.dev, ino=old.ino)
