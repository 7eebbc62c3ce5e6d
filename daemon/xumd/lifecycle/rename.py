"""workspace.rename: journaled (docs/ARCHITECTURE.md, "Durable write order"). The journal `{from,
to, incarnation, phase}` is committed first, then `git worktree move` (or a rename), then `git
branch -m` when the branch is the default `xum/<name>`, then the row and the journal's removal in
one transaction. A failure undoes the steps done; startup recovery rolls an interrupted rename back
or forward."""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.workspace import WorkspaceRenameResult

from xumd.base import faults, logs
from xumd.base.errors import XumError
from xumd.lifecycle import casealias, ids, owned, rows
from xumd.lifecycle.context import UNDO_DEADLINE_S, Context, invalid_state
from xumd.lifecycle.materialise import clear_stale_locks
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
HOLD = faults.declare(
    "workspace.rename.hold",
    "simulate: hold a rename after its checkout moved (if live), before the branch rename and "
    "the row's update, until the test releases it (faults.FaultPoint.hold)",
    simulate=True,
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
        _check_no_journal(ctx, row)
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
            await HOLD.hold()
            if plan.renames_branch:
                await _branch_move(ctx, plan, row.branch, plan.branch)
                plan.branch_renamed = True
                _journal_phase(ctx, row.id, "branch_renamed")
                RENAME_AFTER_BRANCH()
            row = _commit(ctx, plan, row)
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


def _commit(ctx: Context, plan: _Plan, row: WorkspaceRow) -> WorkspaceRow:
    """The row takes the new name, path and branch, and the journal goes, in one transaction."""
    try:
        with ctx.store.transaction():
            row = ctx.update(row, name=plan.name, path=str(plan.path), branch=plan.branch)
            rows.drop_rename_journal(ctx.store, row.id)
    except sqlite3.IntegrityError:
        # UNIQUE(project_id, name): a create (or another rename) took the name after _plan
        # checked it. A lost race on a name, not a daemon fault; the caller undoes the steps.
        other = rows.workspace_by_name(ctx.store, row.project_id, plan.name)
        raise XumError(
            ErrorKind.CONFLICT,
            f"project {plan.project.name!r} already has a workspace {plan.name!r}"
            + (f" ({other.id})" if other is not None else "")
            + " (taken while renaming)",
            **({"id": other.id} if other is not None else {}),
        ) from None
    return row


def _check_no_journal(ctx: Context, row: WorkspaceRow) -> None:
    """A journal left by a rename whose undo failed: the disk is between two names, and only
    recovery may settle it (at the next start, or on `workspace.keep`); a new rename would pile a
    second move on it."""
    found = rows.rename_journal(ctx.store, row.id)
    if found is not None:
        raise invalid_state(
            row,
            f"an earlier rename of {row.name!r} to {found['to_name']!r} is not settled "
            "(its undo failed); settle it first (workspace.keep, or restart the daemon so "
            "recovery does), then rename again",
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
    casealias.check_no_case_alias(ctx.store, ctx.path_for(project, name), row.id)
    branch = row.branch
    if row.runtime == "worktree" and row.branch == f"xum/{row.name}":
        branch = f"xum/{name}"
        taken = await ctx.git.run(
            project.path, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False
        )
        if taken.ok:
            raise XumError(ErrorKind.CONFLICT, f"branch {branch!r} already exists", branch=branch)
    path = ctx.path_for(project, name)
    owned.check_workspace_path(path, project, ctx.app.paths, rows.list_projects(ctx.store))
    return _Plan(project, row, name, path, branch)


def _write_journal(ctx: Context, plan: _Plan) -> None:
    old = plan.old
    with ctx.store.transaction():
        rows.insert_rename_journal(
            ctx.store, old, name=plan.name, path=str(plan.path), branch=plan.branch, now=time.time()
        )


def _journal_phase(ctx: Context, workspace_id: str, phase: str) -> None:
    with ctx.store.transaction():
        rows.set_rename_phase(ctx.store, workspace_id, phase)


async def _branch_move(
    ctx: Context, plan: _Plan, src: str | None, dest: str | None, *, undo: bool = False
) -> bool:
    """`git branch -m`; as an undo, a failure is returned (False), not raised."""
    assert src and dest
    async with ctx.git.admin_lock(plan.project.path):
        done = await ctx.git.run(
            plan.project.path, "branch", "-m", "--", src, dest, check=not undo, what="git branch -m"
        )
    return done.ok


async def _worktree_move(
    ctx: Context, plan: _Plan, src: Path, dest: Path, *, undo: bool = False
) -> bool:
    """`git worktree move`; as an undo, a failure is returned (False; left to recovery)."""
    repo = plan.project.path
    async with ctx.git.admin_lock(repo):
        if not undo:
            await clear_stale_locks(ctx.git, repo)
        # A locked worktree moves only with -f -f (git 2.39); the lock and its reason (our
        # marker) stay with the admin dir.
        done = await ctx.git.run(
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
    return done.ok


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
    """Undo the steps done. The journal goes only when every step is back; otherwise (a step
    failed, or the undo was cut short) it stays for recovery and the row is flagged."""
    old = plan.old
    log.warning("workspace.rename_undo", workspace=old.id)
    problem: str | None = "the undo was cut short"
    try:
        problem = await _undo_steps(ctx, plan)
    finally:
        _settle_undo(ctx, plan, problem)


async def _undo_steps(ctx: Context, plan: _Plan) -> str | None:
    """Move the branch and the checkout back; what could not be put back (None: all of it)."""
    old = plan.old
    problems: list[str] = []
    if plan.branch_renamed:
        done = await _branch_move(ctx, plan, plan.branch, old.branch, undo=True)
        if not done:
            problems.append(f"the branch {plan.branch!r} could not be renamed back")
    UNDO_AFTER_BRANCH()
    if plan.moved:
        try:
            # Directory exclusion for both paths, as `_move` took it (and released it when the
            # move returned, so nothing of this rename's is held here: no self-deadlock). The
            # wait is bounded by the coordinator; a timeout leaves the checkout for recovery.
            async with ctx.directories(old.path, plan.path, label=f"rename undo {old.id}"):
                await _move_back(ctx, plan, problems)
        except XumError as exc:
            if exc.kind is not ErrorKind.TIMEOUT:
                raise
            problems.append(f"{exc.message}, so the checkout stays at {plan.path}")
    return "; ".join(problems) or None


async def _move_back(ctx: Context, plan: _Plan, problems: list[str]) -> None:
    """Under the directory exclusion of both paths: revalidate the old path, then move back."""
    old = plan.old
    if os.path.lexists(old.path):
        # Something took the old path meanwhile: never move into it (git would move the
        # checkout *inside* an existing directory) nor over it.
        problems.append(f"{old.path} is taken, so the checkout stays at {plan.path}")
    elif old.runtime == "worktree":
        if not await _worktree_move(ctx, plan, plan.path, old.path, undo=True):
            problems.append(f"git could not move the checkout back from {plan.path}")
    elif os.path.lexists(plan.path):
        os.rename(plan.path, old.path)
    if os.path.lexists(plan.path):
        problems.append(f"the checkout is still at {plan.path}")
    else:
        UNDO_AFTER_MOVE()


def _settle_undo(ctx: Context, plan: _Plan, problem: str | None) -> None:
    old = plan.old
    with ctx.store.transaction():
        if problem is None:
            rows.drop_rename_journal(ctx.store, old.id)
            return
        reason = (
            f"rename {old.name!r} -> {plan.name!r} failed and its undo did not finish: "
            f"{problem}; keep it (workspace.keep) or restart the daemon to settle it by what "
            "the disk shows (the rename journal is kept)"
        )
        flagged = rows.update_workspace(
            ctx.store,
            old.id,
            expect_incarnation=old.incarnation,
            interrupted=1,
            interrupted_reason=reason,
        )
    log.error("workspace.rename_undo_failed", workspace=old.id, problem=problem)
    if flagged is not None:
        ctx.publish("workspace.interrupted", flagged, reason=reason)
