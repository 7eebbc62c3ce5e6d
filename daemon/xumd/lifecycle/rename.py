"""workspace.rename: journaled (design section 6). The journal `{from, to, incarnation, phase}`
is committed first, then `git worktree move` (or a rename), then `git branch -m` when the branch
is the default `xum/<name>`, then the row and the journal's removal in one transaction. A failure
undoes the steps done; startup recovery rolls an interrupted rename back or forward."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.workspace import WorkspaceRenameResult

from xumd import faults, logs
from xumd.errors import XumError
from xumd.lifecycle import ids, rows
from xumd.lifecycle.checkout import clear_stale_locks
from xumd.lifecycle.context import UNDO_DEADLINE_S, Context, invalid_state
from xumd.lifecycle.rows import ProjectRow, WorkspaceRow

log = logs.get("xumd.lifecycle.rename")

RENAME_AFTER_JOURNAL = faults.declare("workspace.rename.after_journal")
RENAME_AFTER_MOVE = faults.declare("workspace.rename.after_move")
RENAME_AFTER_BRANCH = faults.declare("workspace.rename.after_branch")
UNDO_AFTER_BRANCH = faults.declare(
    "workspace.rename.undo.after_branch",
    "a failed rename's branch is back (if it moved); the checkout is not moved back yet",
)
UNDO_AFTER_MOVE = faults.declare(
    "workspace.rename.undo.after_move",
    "a failed rename's checkout is back at its old path; the journal is not dropped yet",
)


@dataclass(slots=True)
class _Plan:
    project: ProjectRow
    old: WorkspaceRow
    name: str
    path: Path
    branch: str | None
    moved: bool = False
    branch_renamed: bool = False

    @property
    def renames_branch(self) -> bool:
        return bool(self.old.branch and self.branch and self.branch != self.old.branch)


async def rename(ctx: Context, workspace_id: str, name: str) -> WorkspaceRenameResult:
    ids.check_name(name)
    async with ctx.coord.exclusive(workspace_id, "rename") as ref:
        row = ctx.row(ref.id)
        if row.state not in ("active", "archived"):
            raise invalid_state(row, f"workspace {row.name!r} is {row.state}; cannot rename it now")
        project = ctx.project(row.project_id)
        if name == row.name:
            return _result(ctx, row, row, branch_renamed=False)
        plan = await _plan(ctx, project, row, name)
        live = row.state == "active"
        if live:
            await ctx.quiescent(row, "rename")
            _check_free(plan.path)
        _write_journal(ctx, plan)
        RENAME_AFTER_JOURNAL()
        try:
            if live:
                await _move(ctx, plan)
                plan.moved = True
                _journal_phase(ctx, row.id, "moved")
                RENAME_AFTER_MOVE()
            if plan.renames_branch:
                await _branch_move(ctx, plan, row.branch, plan.branch)
                plan.branch_renamed = True
                _journal_phase(ctx, row.id, "branch_renamed")
                RENAME_AFTER_BRANCH()
            with ctx.store.transaction():
                row = ctx.update(row, name=name, path=str(plan.path), branch=plan.branch)
                ctx.store.execute("DELETE FROM rename_journal WHERE workspace_id = ?", (row.id,))
        except BaseException:
            with anyio.CancelScope(shield=True), anyio.move_on_after(UNDO_DEADLINE_S):
                await _undo(ctx, plan)
            raise
        ctx.publish("workspace.renamed", row, previous_name=plan.old.name)
        return _result(ctx, row, plan.old, branch_renamed=plan.branch_renamed)


def _result(
    ctx: Context, row: WorkspaceRow, old: WorkspaceRow, *, branch_renamed: bool
) -> WorkspaceRenameResult:
    return WorkspaceRenameResult(
        workspace=ctx.info(row),
        previous_name=old.name,
        previous_path=str(old.path),
        branch_renamed=branch_renamed,
    )


def _check_free(path: Path) -> None:
    if os.path.lexists(path):
        raise XumError(ErrorKind.CONFLICT, f"{path} already exists", path=str(path))


async def _plan(ctx: Context, project: ProjectRow, row: WorkspaceRow, name: str) -> _Plan:
    other = rows.workspace_by_name(ctx.store, row.project_id, name)
    if other is not None:
        raise XumError(
            ErrorKind.CONFLICT,
            f"project {project.name!r} already has a workspace {name!r} ({other.id})",
            id=other.id,
        )
    branch = row.branch
    if row.runtime == "worktree" and row.branch == f"xum/{row.name}":
        branch = f"xum/{name}"
        taken = await ctx.git.run(
            project.path, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False
        )
        if taken.ok:
            raise XumError(ErrorKind.CONFLICT, f"branch {branch!r} already exists", branch=branch)
    return _Plan(project, row, name, ctx.path_for(project, name), branch)


def _write_journal(ctx: Context, plan: _Plan) -> None:
    old = plan.old
    with ctx.store.transaction():
        ctx.store.execute(
            "INSERT INTO rename_journal (workspace_id, from_name, to_name, from_path,"
            " to_path, from_branch, to_branch, incarnation, phase, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'intent', ?)",
            (
                old.id,
                old.name,
                plan.name,
                str(old.path),
                str(plan.path),
                old.branch,
                plan.branch,
                old.incarnation,
                time.time(),
            ),
        )


def _journal_phase(ctx: Context, workspace_id: str, phase: str) -> None:
    with ctx.store.transaction():
        ctx.store.execute(
            "UPDATE rename_journal SET phase = ? WHERE workspace_id = ?", (phase, workspace_id)
        )


async def _branch_move(
    ctx: Context, plan: _Plan, src: str | None, dest: str | None, *, undo: bool = False
) -> None:
    assert src and dest
    async with ctx.git.admin_lock(plan.project.path):
        await ctx.git.run(
            plan.project.path, "branch", "-m", "--", src, dest, check=not undo, what="git branch -m"
        )


async def _worktree_move(
    ctx: Context, plan: _Plan, src: Path, dest: Path, *, undo: bool = False
) -> None:
    """`git worktree move`; as an undo, best effort (a failure is left to recovery)."""
    repo = plan.project.path
    async with ctx.git.admin_lock(repo):
        if not undo:
            await clear_stale_locks(ctx.git, repo)
        # A locked worktree moves only with -f -f (git 2.39); the lock and its reason (our
        # marker) stay with the admin dir.
        await ctx.git.run(
            repo,
            "worktree",
            "move",
            "-f",
            "-f",
            str(src),
            str(dest),
            check=not undo,
            what="git worktree move",
        )


async def _move(ctx: Context, plan: _Plan) -> None:
    row = plan.old
    async with ctx.directories(row.path, plan.path):
        _check_free(plan.path)
        if not ctx.owns_checkout(row):
            raise XumError(
                ErrorKind.CONFLICT,
                f"{row.path} does not carry the marker of {row.id}; refusing to move it",
            )
        plan.path.parent.mkdir(parents=True, exist_ok=True)
        if row.runtime == "worktree":
            await _worktree_move(ctx, plan, row.path, plan.path)
        else:
            os.rename(row.path, plan.path)


async def _undo(ctx: Context, plan: _Plan) -> None:
    old = plan.old
    log.warning("workspace.rename_undo", workspace=old.id)
    try:
        if plan.branch_renamed:
            await _branch_move(ctx, plan, plan.branch, old.branch, undo=True)
        UNDO_AFTER_BRANCH()
        if plan.moved:
            if old.runtime == "worktree":
                await _worktree_move(ctx, plan, plan.path, old.path, undo=True)
            elif os.path.lexists(plan.path) and not os.path.lexists(old.path):
                os.rename(plan.path, old.path)
            UNDO_AFTER_MOVE()
    finally:
        with ctx.store.transaction():
            ctx.store.execute("DELETE FROM rename_journal WHERE workspace_id = ?", (old.id,))
