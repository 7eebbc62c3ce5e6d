"""The startup pass: reconcile every workspace row (and rename journal, and turn) with the disk.

Runs before readiness, after the root lock. By the durable write order (docs/ARCHITECTURE.md), a
crash lands between an intent committed in the store and its effect on disk, or between the effect
and its completion. For each in-between state the pass rolls forward or back when the disk proves
which, and otherwise flags the row `interrupted` with a reason for the user to resolve with ordinary
calls (`workspace.keep`, `workspace.remove`, `workspace.archive`, `workspace.unarchive`, a rename
again). It never deletes: the only destructive consequence it may plan is a fenced cleanup
obligation for a checkout it just rolled back (an unarchive that never finished restoring), whose
content the snapshot holds. It finishes an interrupted unarchive's preserved files: the user's saved
copy is put back over what setup wrote, and the copy deleted only once verified in place
(`_settle_saved_copies`).

Cost: one query for all rows, an lstat per settled row (identity agrees: done), marker reads only
for in-between rows, one transaction for every change; git runs only for a rename journal.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from xum_protocol.errors import ErrorKind

from xumd.base import faults, logs
from xumd.base.errors import XumError
from xumd.lifecycle import preserved, rows
from xumd.lifecycle.context import is_rows_checkout
from xumd.lifecycle.rows import ProjectRow, WorkspaceRow
from xumd.recovery.disk import Probe, probe, same_identity
from xumd.system.git import Git

if TYPE_CHECKING:  # pragma: no mutate (an annotation-only import of a lower layer: no cycle)
    from xumd.app import App

log = logs.get("xumd.recovery")

AFTER_COMMIT = faults.declare(
    "recovery.reconcile.after_commit", "row repairs committed; events and renames not yet done"
)
RENAME_AFTER_BRANCH = faults.declare(
    "recovery.rename.after_branch", "branch renamed by a roll-forward; row not yet updated"
)

SETUP_FINISHED = ("ok", "failed", "timeout", "untrusted", "none")


@dataclass
class Change:
    row: WorkspaceRow
    fields: dict[str, Any]
    action: str
    plan_removal: Probe | None = None
    """Plan a cleanup of this checkout (identity from the probe) in the same transaction."""


@dataclass
class RecoveryReport:
    rows: int = 0
    actions: dict[str, int] = field(default_factory=dict)
    interrupted: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    turns: dict[str, int] = field(default_factory=dict)
    ms: float = 0.0

    def count(self, action: str) -> None:
        self.actions[action] = self.actions.get(action, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "actions": dict(self.actions),
            "interrupted_now": len(self.interrupted),
            "missing_checkouts": len(self.missing),
            "turns": dict(self.turns),
            "ms": self.ms,
        }


class _Unprovable(Exception):
    """A strict settle (workspace.keep) met a journal whose outcome the disk does not prove."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def _flag(reason: str, **fields: Any) -> dict[str, Any]:
    return {"interrupted": 1, "interrupted_reason": reason, **fields}


class Announce(Protocol):
    """A settled row's events, the workspace shown as the protocol shows it (the lifecycle's
    `context.Announcer`)."""

    def publish(self, event: str, row: WorkspaceRow, **extra: Any) -> None: ...


class RemovalPlans(Protocol):
    """The cleanup of a checkout the pass rolled back (`CleanupService`), planned in the
    pass's transaction."""

    def plan_checkout_removal(
        self,
        *,
        workspace_id: str,
        project_id: str,
        incarnation: str,
        runtime: str,
        repo_path: Path,
        checkout: Path,
        dev: int | None,
        ino: int | None,
        teardown: bool,
    ) -> object: ...


SettleTurns = Callable[[], dict[str, int]]
"""Settle the turns left `creating` (`xumd.turns.service.reconcile`), in the pass's
transaction; returns the counts by outcome."""


class Reconciler:
    """The startup pass, and the settling of one row (`settle_row`, `settle_journal`) that the
    lifecycle asks for. Its collaborators are ports built before the workspace service (the
    lifecycle's failure guard and hooks take its settlers at construction), so it holds none of
    the lifecycle's services."""

    def __init__(
        self,
        app: App,
        git: Git,
        *,
        announce: Announce,
        removals: RemovalPlans,
        turns: SettleTurns,
    ) -> None:
        self.app = app
        self.store = app.store
        self.git = git
        self.announce = announce
        self.removals = removals
        self.turns = turns

    async def run(self) -> RecoveryReport:
        started = time.perf_counter()
        report = RecoveryReport()
        projects = {p.id: p for p in rows.list_projects(self.store)}
        journals = {r["workspace_id"]: dict(r) for r in rows.rename_journals(self.store)}
        changes: list[Change] = []
        # Slim rows, read as iterated: a settled row whose identity agrees costs one lstat, and
        # the rows are never all held at once.
        for entry in rows.workspace_summaries(self.store):
            report.rows += 1
            if entry["id"] in journals or entry["state"] == "archived":
                continue  # journals: below, one by one (git); archived: nothing on disk
            if (
                entry["state"] == "active"
                and entry["setup_status"] != "running"  # a rerun setup cut short: settle it
                and same_identity(entry["path"], entry["dev"], entry["ino"])
            ):
                continue
            row = rows.get_workspace(self.store, entry["id"])
            if row is None:
                continue  # pragma: no mutate (the row was just listed in the same synchronous loop)
            change = self._decide(row, report)
            if change is not None:
                changes.append(change)
        with self.store.transaction():
            applied = [c for c in changes if self._apply(c, projects)]
            report.turns = self.turns()
        AFTER_COMMIT()
        for change in applied:
            self._announce(change, report)
        for workspace_id, journal in journals.items():
            current = rows.get_workspace(self.store, workspace_id)
            if current is None:
                with self.store.transaction():
                    self._drop_journal(workspace_id)
                continue
            await self._rename(current, journal, projects.get(current.project_id), report)
        self._settle_saved_copies(report)
        report.ms = round((time.perf_counter() - started) * 1000, 2)
        log.info("recovery.done", **report.as_dict())
        return report

    async def settle_journal(self, workspace_id: str) -> str | None:
        """Settle one workspace's rename journal now, as the startup pass would (the seam
        `LifecycleHooks.rename_settler`; workspace.keep calls it under the workspace's exclusive
        reservation). Returns the problem the settled row stays flagged with (None: settled
        cleanly). When the disk proves neither state it raises `invalid_state` naming why and
        changes nothing: the journal and the flag stay (a start-up would drop the journal)."""
        found = rows.rename_journal(self.store, workspace_id)
        row = rows.get_workspace(self.store, workspace_id)
        if found is None or row is None:
            return None
        project = rows.get_project(self.store, row.project_id)
        try:
            return await self._rename(row, dict(found), project, RecoveryReport(), strict=True)
        except _Unprovable as exc:
            raise XumError(
                ErrorKind.INVALID_STATE,
                f"cannot settle the interrupted rename of {row.name!r}: {exc.problem}; the "
                "rename journal and the flag stay (fix the disk, then keep it again)",
                state=row.state,
                id=row.id,
            ) from None

    def settle_row(self, workspace_id: str, cause: str) -> str | None:
        """Settle one row that a failed operation left mid-way (the `row_settler` seam; the
        caller holds the workspace's reservation or is its creator): the startup pass's own
        decision for that state, with the failure leading the reason of a flag. A row with a
        rename journal is flagged (the journal is kept; workspace.keep or a restart settles it
        by what the disk shows, which needs git). Returns the action taken."""
        row = rows.get_workspace(self.store, workspace_id)
        if row is None:
            return None
        if rows.has_rename_journal(self.store, workspace_id):
            if row.interrupted:
                return None
            reason = (
                f"{cause}; the rename journal is kept: keep it (workspace.keep) or restart the "
                "daemon to settle it by what the disk shows"
            )
            change: Change | None = Change(row, _flag(reason), "interrupted")
        elif row.state in {"active", "archived"}:
            return None
        else:
            change = self._decide(row, RecoveryReport())
        if change is None:
            return None
        if change.fields.get("interrupted"):
            reason = change.fields.get("interrupted_reason") or ""
            if not reason.startswith(cause):
                change.fields["interrupted_reason"] = f"{cause}: {reason}"
        projects = {p.id: p for p in rows.list_projects(self.store)}
        with self.store.transaction():
            applied = self._apply(change, projects)
        if not applied:
            return None
        self._announce(change, RecoveryReport())
        return change.action

    def _settle_saved_copies(self, report: RecoveryReport) -> None:
        """An unarchive that crashed after `restoring` rolled forward (or after `active`) left
        its saved copy of preserved files, and perhaps setup's file at a preserved path: put the
        user's copy back, verify it in place, and only then delete the copy (one that does not
        verify is set aside as a kept copy). Only an active workspace whose checkout carries its
        marker, with a copy of an earlier incarnation; anything else is left as it is (the next
        archive sets an unsettled copy aside, never replaces it). One directory listing and one
        query, then a manifest read per active workspace that has a copy."""
        store = self.app.paths.archive_store
        try:
            with os.scandir(store) as entries:
                names = [
                    e.name
                    for e in entries
                    if e.name.startswith("ws_") and "." not in e.name and e.is_dir()
                ]
        except (FileNotFoundError, NotADirectoryError):
            return
        if not names:
            return
        live = rows.workspaces_among(self.store, names)
        for name in names:
            if name not in live or live[name]["state"] != "active":
                continue  # an archived workspace's copy (or a kept one): not ours to settle
            row = rows.get_workspace(self.store, name)
            if row is None or row.state != "active":
                # Not mutated: the row was just read as active in the same synchronous loop.
                continue  # pragma: no mutate
            copy = preserved.load(store / name)
            if copy is None or copy.incarnation == row.incarnation:
                continue
            if not is_rows_checkout(row):
                continue
            try:
                settled = preserved.settle_and_verify(copy, row.path)
                kept = str(preserved.set_aside(copy)) if settled.problems else None
                if kept is None:
                    preserved.discard(copy)
            except OSError as exc:
                log.warning("recovery.preserved_settle_failed", workspace=row.id, error=str(exc))
                continue
            report.count("preserved_settled")
            log.warning(
                "recovery.preserved_settled",
                workspace=row.id,
                replaced=settled.replaced,
                unverified=settled.problems,
                kept=kept,
            )

    # -- decisions (pure: no writes) -------------------------------------------------------------

    def _decide(self, row: WorkspaceRow, report: RecoveryReport) -> Change | None:
        if row.state == "active":
            if not probe(row).ours:
                # Deleted or replaced by hand: reported, not flagged (archive/remove handle it).
                report.missing.append(row.id)
            if row.setup_status == "running":
                # A rerun setup (workspace.setup) cut by a crash: it is not running any more.
                # Said so, never left `running`; the user runs it again.
                error = "setup was interrupted by a crash (run it again: xum ws setup)"
                fields = {"setup_status": "failed", "setup_output": json.dumps({"error": error})}
                return Change(row, fields, "setup_interrupted")
            return None
        if row.state == "creating":
            return self._creating(row)
        if row.state == "archiving":
            return self._archiving(row)
        if row.state == "restoring":
            return self._restoring(row)
        if row.state == "removing":
            return self._removing(row)
        return None  # archived: nothing on disk to agree with

    def _creating(self, row: WorkspaceRow) -> Change | None:
        if row.interrupted:
            return None  # flagged by an earlier start; the user decides
        disk = probe(row)
        if disk.ours and row.setup_status in SETUP_FINISHED:
            return Change(row, {"state": "active", "dev": disk.dev, "ino": disk.ino}, "completed")
        if disk.ours:
            reason = (
                "creation was interrupted after the checkout was made; setup never finished "
                "(keep it or remove it)"
            )
            return Change(row, _flag(reason, dev=disk.dev, ino=disk.ino), "interrupted")
        if disk.absent:
            reason = "creation was interrupted before the checkout was made (remove it)"
        else:
            reason = f"creation was interrupted; {disk.detail} (remove it; that is left alone)"
        return Change(row, _flag(reason), "interrupted")

    def _archiving(self, row: WorkspaceRow) -> Change:
        # Nothing is deleted before `archived` commits: the checkout is intact, roll back.
        disk = probe(row)
        if disk.ours or disk.absent:
            return Change(row, {"state": "active"}, "archive_rolled_back")
        reason = f"archive was interrupted; {disk.detail}"
        return Change(row, _flag(reason, state="active"), "interrupted")

    def _restoring(self, row: WorkspaceRow) -> Change:
        disk = probe(row)
        if disk.absent:
            return Change(row, {"state": "archived"}, "unarchive_rolled_back")
        if not disk.ours:
            reason = f"unarchive was interrupted; {disk.detail} (left alone)"
            return Change(row, _flag(reason, state="archived"), "interrupted")
        if row.ino is not None:
            # The restore finished (identity recorded after it): roll forward.
            fields: dict[str, Any] = {"state": "active"}
            if row.setup_status not in SETUP_FINISHED:
                fields.update(
                    _flag("unarchive was interrupted during setup (keep it or remove it)"),
                    setup_status="failed",
                    setup_output=json.dumps({"error": "setup was interrupted by a crash"}),
                )
            return Change(row, fields, "unarchive_completed")
        # Recreated but the restore may be partial: roll back. Everything in that checkout is
        # in the branch, the snapshot commit and the archive store, so a fenced cleanup frees it.
        return Change(row, {"state": "archived"}, "unarchive_rolled_back", plan_removal=disk)

    def _removing(self, row: WorkspaceRow) -> Change:
        # The row is deleted in the same transaction that plans the cleanup: a `removing` row
        # means nothing was deleted yet. Roll back; the user removes again (or keeps).
        disk = probe(row)
        prior = rows.removal_prior_state(self.store, row.id)
        if row.interrupted:
            # Flagged before the removal began (a creation never kept, or an active or archived
            # row flagged by an earlier pass): back to the state it was removed from, flag and
            # reason kept. No record: a removal begun by an older daemon; its rule stands.
            return Change(row, {"state": prior or "creating"}, "remove_rolled_back")
        reason = "removal was interrupted before it was committed; remove again or keep it"
        if prior in ("active", "archived"):
            # Back to where the removal began, as its in-process failure puts it: the checkout
            # does not tell. An archived workspace's checkout may linger (its trash step
            # pending): made `active` by it, the workspace was no longer archived, and its
            # pending trash was abandoned for good. Flagged: the user learns of the cut.
            if disk.ours or disk.absent:
                return Change(row, _flag(reason, state=prior), "remove_rolled_back")
            return Change(row, _flag(f"{reason}; {disk.detail}", state=prior), "interrupted")
        # No record (a removal begun by an older daemon): judged by what the disk shows.
        if disk.ours:
            return Change(row, _flag(reason, state="active"), "remove_rolled_back")
        if disk.absent:
            return Change(row, _flag(reason, state="archived"), "remove_rolled_back")
        return Change(row, _flag(f"{reason}; {disk.detail}", state="archived"), "interrupted")

    # -- writes (inside the one transaction) ------------------------------------------------------

    def _apply(self, change: Change, projects: dict[str, ProjectRow]) -> bool:
        row = change.row
        new = rows.update_workspace(
            self.store, row.id, expect_incarnation=row.incarnation, **change.fields
        )
        if new is None:
            # Not mutated: unreachable: the pass decides and applies with no await between.
            return False  # pragma: no mutate
        if change.plan_removal is not None:
            project = projects.get(row.project_id)
            if project is not None:
                self.removals.plan_checkout_removal(
                    workspace_id=row.id,
                    project_id=row.project_id,
                    incarnation=row.incarnation,
                    runtime=row.runtime,
                    repo_path=project.path,
                    checkout=row.path,
                    dev=change.plan_removal.dev,
                    ino=change.plan_removal.ino,
                    teardown=False,
                )
        change.row = new
        return True

    def _announce(self, change: Change, report: RecoveryReport) -> None:
        row = change.row
        report.count(change.action)
        self.announce.publish("workspace.state_changed", row, recovered=change.action)
        if change.fields.get("interrupted"):
            report.interrupted.append(row.id)
            self.announce.publish("workspace.interrupted", row, reason=row.interrupted_reason)
        log.warning(
            "recovery.workspace_reconciled",
            workspace=row.id,
            action=change.action,
            state=row.state,
            interrupted=row.interrupted,
        )

    def _drop_journal(self, workspace_id: str) -> None:
        rows.drop_rename_journal(self.store, workspace_id)

    # -- rename journals (the durable write order) ---------------------------------------------

    async def _branch_exists(self, project: ProjectRow, branch: str) -> bool:
        found = await self.git.run(
            project.path, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False
        )
        return found.ok

    async def _rename(
        self,
        row: WorkspaceRow,
        journal: dict[str, Any],
        project: ProjectRow | None,
        report: RecoveryReport,
        *,
        strict: bool = False,
    ) -> str | None:
        """Roll back when only the old state is on disk, forward when only the new one is (with
        this incarnation's marker and identity), otherwise flag for the user. The row keeps the
        old name/path/branch until the rename's last transaction, so 'back' means: drop the
        journal (and undo a branch rename). Returns the problem the row is flagged with.

        `strict` (workspace.keep): when neither state is provable, raise `_Unprovable` before
        any write instead of flagging the row and dropping the journal."""

        def unprovable(problem: str) -> str | None:
            if strict:
                raise _Unprovable(problem)
            return self._settle_rename(row, None, problem, report)

        if project is None or journal["incarnation"] != row.incarnation:
            return unprovable("rename journal does not match the workspace")
        from_path, to_path = journal["from_path"], journal["to_path"]
        from_branch, to_branch = journal["from_branch"], journal["to_branch"]
        branch_moves = bool(from_branch and to_branch and from_branch != to_branch)
        # Not mutated: never read: set from the probes or the branches first.
        old_there = new_there = True  # pragma: no mutate
        if row.state == "active":
            old = probe(row, row.path.__class__(from_path))
            new = probe(row, row.path.__class__(to_path))
            old_there, new_there = old.ours, new.ours
            if (old_there and os.path.lexists(to_path)) or (
                new_there and os.path.lexists(from_path)
            ):
                # both spellings exist: not provable
                # Not mutated: both True or both False: unprovable alike.
                old_there = new_there = False  # pragma: no mutate
        # Not mutated: read only when the branch moves, set from git first.
        branch_at_old = branch_at_new = False  # pragma: no mutate
        if branch_moves:
            assert from_branch and to_branch
            branch_at_old = await self._branch_exists(project, from_branch)
            branch_at_new = await self._branch_exists(project, to_branch)
            if branch_at_old == branch_at_new:
                return unprovable(
                    f"rename was interrupted: branches {from_branch!r} and {to_branch!r} "
                    f"{'both' if branch_at_old else 'neither'} exist"
                )
        if row.state != "active":
            # Archived: only the branch moved (or nothing).
            old_there, new_there = (branch_at_old, branch_at_new) if branch_moves else (True, False)
        if old_there and not new_there:
            if branch_moves and branch_at_new:
                assert from_branch and to_branch
                failed = await self._move_branch(project, to_branch, from_branch)
                if failed:
                    # The row follows the disk: old name and path, the branch where it is.
                    return self._settle_rename(
                        row,
                        {"branch": to_branch},
                        f"rename was rolled back, but the branch {to_branch!r} could not be "
                        f"renamed back to {from_branch!r} ({failed}); it keeps {to_branch!r}",
                        report,
                    )
                RENAME_AFTER_BRANCH()
            return self._settle_rename(row, None, None, report)
        if new_there and not old_there:
            other = rows.workspace_by_name(self.store, row.project_id, journal["to_name"])
            if other is not None and other.id != row.id:
                return unprovable(f"rename was interrupted; {journal['to_name']!r} is taken")
            forward = {"name": journal["to_name"], "path": to_path, "branch": to_branch}
            if branch_moves and branch_at_old:
                assert from_branch and to_branch
                failed = await self._move_branch(project, from_branch, to_branch)
                if failed:
                    # The checkout is at the new path (the disk proves it): roll forward, and
                    # keep the branch that git refuses to rename (a failed rename's undo that
                    # was cut short lands here).
                    forward["branch"] = from_branch
                    return self._settle_rename(
                        row,
                        forward,
                        f"rename was rolled forward, but the branch {from_branch!r} could not "
                        f"be renamed to {to_branch!r} ({failed}); it keeps {from_branch!r}",
                        report,
                    )
                RENAME_AFTER_BRANCH()
            return self._settle_rename(row, forward, None, report)
        return unprovable(
            f"rename {journal['from_name']!r} -> {journal['to_name']!r} was interrupted and the "
            f"disk shows neither state ({from_path}, {to_path}); check both paths"
        )

    async def _move_branch(self, project: ProjectRow, src: str, dst: str) -> str | None:
        """Rename a branch; git's error when it refuses (a start-up never fails on it)."""
        async with self.git.admin_lock(project.path):
            done = await self.git.run(project.path, "branch", "-m", "--", src, dst, check=False)
        if done.ok:
            return None
        return done.output.tail_text(300).strip() or f"git exited with {done.returncode}"

    def _settle_rename(
        self,
        row: WorkspaceRow,
        forward: dict[str, Any] | None,
        problem: str | None,
        report: RecoveryReport,
    ) -> str | None:
        fields = dict(forward or {})
        if problem:
            fields.update(_flag(problem))
        with self.store.transaction():
            new = (
                rows.update_workspace(
                    self.store, row.id, expect_incarnation=row.incarnation, **fields
                )
                if fields
                else row
            )
            self._drop_journal(row.id)
        action = (
            "interrupted"
            if problem
            else ("rename_rolled_forward" if forward else "rename_rolled_back")
        )
        if new is not None:
            self._announce(Change(new, fields, action), report)
        return problem
