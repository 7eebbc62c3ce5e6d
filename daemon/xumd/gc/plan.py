"""Planning: what each policy selects now, checked against the disk and git, and what it frees.
Nothing here changes anything. A candidate that is not provably stale (interrupted, busy, with
work no snapshot holds, a removal the daemon has no record of) is listed as skipped, with why."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from xum_protocol.models.gc import GcAction, GcItem, GcPolicies, GcSkipped

from xumd.base.config import GcConfig
from xumd.base.paths import RootPaths
from xumd.checkouts.marker import WorkspaceRef
from xumd.lifecycle import rows
from xumd.lifecycle.carry import CARRY_NS
from xumd.lifecycle.hooks import Holder, busy_message
from xumd.lifecycle.rows import ProjectRow, WorkspaceRow
from xumd.recovery import strays
from xumd.store import Store
from xumd.system.git import Git
from xumd.usage.service import UsageService

DAY_S = 86400.0
SNAPSHOT_REFS = "refs/xum/snapshots/"
CARRY_REFS = f"{CARRY_NS}/"
CARRY_FIELDS = "%(refname) %(objectname) %(committerdate:unix)"
AHEAD_TOLERANCE_S = 60.0
"""A stamp this far after the gc clock's now was written on a clock that has since stepped back
(or that ran ahead of the boot-anchored clock: `GcClock`); closer than this is the anchor's
whole-second rounding and a stamp written this instant."""


@dataclass(slots=True)
class Plan:
    now: float
    keys: frozenset[str] | None = None
    """A run's chosen keys: only those items are measured (the rest are not collected)."""
    items: list[GcItem] = field(default_factory=list)
    skipped: list[GcSkipped] = field(default_factory=list)

    def measures(self, key: str) -> bool:
        return self.keys is None or key in self.keys

    def skip(self, item: GcItem, reason: str) -> None:
        self.skipped.append(skipped(item, reason))

    def ahead(self, stamp: float) -> str | None:
        """Why a record stamped `stamp` cannot be aged now: it is stamped after now, so the
        wall clock stepped between its stamp and now. Its true age is unknown; it is counted
        once the clock passes the stamp (never kept forever, never collected early)."""
        if stamp - self.now <= AHEAD_TOLERANCE_S:
            return None
        hours = (stamp - self.now) / 3600
        return (
            f"stamped {hours:.1f} h after the gc clock's now: the wall clock stepped since;"
            " its age counts once the clock passes the stamp"
        )


def skipped(item: GcItem, reason: str, kind: str | None = None) -> GcSkipped:
    """What the plan or the run says of an item it leaves, and why."""
    return GcSkipped(
        key=item.key,
        action=item.action,
        workspace_id=item.workspace_id,
        name=item.name,
        reason=reason,
        kind=kind,
    )


def workspace_item(
    row: WorkspaceRow, action: GcAction, reason: str, *, age_days: float, size: int = 0
) -> GcItem:
    """The plan's item that collects one workspace (its key: `<action>:<workspace id>`)."""
    return GcItem(
        key=f"{action}:{row.id}",
        action=action,
        workspace_id=row.id,
        project_id=row.project_id,
        name=row.name,
        path=str(row.path),
        age_days=age_days,
        bytes=size,
        reason=reason,
    )


def policies(config: GcConfig) -> GcPolicies:
    return GcPolicies(
        archived_after_days=config.archived_after_days,
        snapshot_refs_days=config.snapshot_refs_days,
        archive_merged=config.archive_merged,
        kept_after_days=config.kept_after_days,
        min_free_bytes=config.min_free_bytes,
        min_free_percent=config.min_free_percent,
        max_bytes=config.max_bytes,
        rebuildable=list(config.rebuildable),
        max_workspaces=config.max_workspaces,
        archive_idle_days=config.archive_idle_days,
    )


class Holders(Protocol):
    """Who uses a checkout (the lifecycle's whole quiescence check, `LifecycleHooks.holders`):
    an active workspace someone works in is not collected."""

    async def holders(self, workspace: WorkspaceRef) -> list[Holder]: ...


@dataclass(slots=True)
class Planner:
    store: Store
    paths: RootPaths
    git: Git
    hooks: Holders
    usage: UsageService
    config: GcConfig

    async def plan(self, now: float, keys: frozenset[str] | None = None) -> Plan:
        plan = Plan(now, keys)
        if self.config.archived_after_days > 0:
            await self._archived(plan, self.config.archived_after_days)
        if self.config.snapshot_refs_days > 0:
            await self._snapshot_refs(plan, self.config.snapshot_refs_days)
            await self._carry_refs(plan, self.config.snapshot_refs_days)
        if self.config.archive_merged:
            await self._merged(plan)
        if self.config.kept_after_days > 0:
            await self._kept(plan, self.config.kept_after_days)
        return plan

    async def _add_workspace(
        self,
        plan: Plan,
        row: WorkspaceRow,
        action: GcAction,
        age: float,
        *,
        reason: str,
        why_not: str | None,
    ) -> None:
        """An item that collects one workspace: skipped (`why_not`), or planned with the bytes it
        frees measured now (only a planned item a run collects is walked: a skipped one frees
        nothing, and `xum gc` runs one key at a time)."""
        item = workspace_item(row, action, reason, age_days=age)
        if why_not:
            plan.skip(item, why_not)
            return
        if plan.measures(item.key):
            figures = await self.usage.figures(row, refresh=True)
            item = item.model_copy(update={"bytes": figures.bytes if figures else 0})
        plan.items.append(item)

    # -- archived workspaces ------------------------------------------------------------------

    async def _archived(self, plan: Plan, days: float) -> None:
        for row in rows.list_workspaces(self.store, state="archived"):
            age = (plan.now - row.updated_at) / DAY_S
            stepped = plan.ahead(row.updated_at)
            if stepped:
                await self._add_workspace(
                    plan, row, "remove_archived", 0.0, reason="archived", why_not=stepped
                )
                continue
            if age < days:
                continue
            await self._add_workspace(
                plan,
                row,
                "remove_archived",
                age,
                reason=f"archived {age:.1f} days ago (policy: {days:g})",
                why_not=_interrupted(row),
            )

    async def _refs(self, prefix: str, fields: str) -> AsyncIterator[tuple[ProjectRow, str]]:
        """Each git project's refs under `prefix`, one `for-each-ref` line (`fields`) each; a
        project git cannot list is passed over (planned again at the next run)."""
        for project in rows.list_projects(self.store):
            if project.kind != "git" or not project.path.is_dir():
                continue
            listed = await self.git.run(
                project.path, "for-each-ref", f"--format={fields}", prefix, check=False
            )
            if listed.ok:
                for line in listed.output.text().splitlines():
                    yield project, line

    # -- snapshot refs of removed workspaces --------------------------------------------------

    async def _snapshot_refs(self, plan: Plan, days: float) -> None:
        live = set(rows.workspace_projects(self.store))
        removed = rows.tombstone_times(self.store)
        async for project, line in self._refs(SNAPSHOT_REFS, "%(refname) %(objectname)"):
            ref, _, commit = line.partition(" ")
            parts = ref[len(SNAPSHOT_REFS) :].split("/")
            workspace_id = parts[0]
            if workspace_id in live:
                continue  # an archived workspace's snapshot is its saved work
            item = GcItem(
                key=f"prune_snapshot_ref:{project.id}:{ref}",
                action="prune_snapshot_ref",
                workspace_id=workspace_id,
                project_id=project.id,
                ref=ref,
                path=str(project.path),
                commit=commit,
                age_days=0.0,
                reason="snapshot of a removed workspace",
            )
            when = removed.get(workspace_id)
            if when is None:
                plan.skip(item, "no record of its workspace's removal: not provably stale")
                continue
            stepped = plan.ahead(when)
            if stepped:
                plan.skip(item, stepped)
                continue
            age = (plan.now - when) / DAY_S
            if age < days:
                continue
            plan.items.append(
                item.model_copy(
                    update={
                        "age_days": age,
                        "reason": f"workspace removed {age:.1f} days ago (policy: {days:g})",
                    }
                )
            )

    # -- carry refs left by a create that did not finish ----------------------------------------

    async def _carry_refs(self, plan: Plan, days: float) -> None:
        """`refs/xum/carry/<ws>` that a create left (a crash between its capture and the end of
        its `move`, or a move that left paths the user changed meanwhile), aged by the carry
        commit's own date. Either place held the work all along: the main checkout is written
        only after the workspace is `active` with the work restored and verified, so the ref
        is a second copy, kept as long as a removed workspace's snapshot ref (the same
        policy). A create runs for minutes at most, so no ref this old belongs to one."""
        async for project, line in self._refs(CARRY_REFS, CARRY_FIELDS):
            ref, commit, date = [*line.split(" "), "", ""][:3]
            workspace_id = ref[len(CARRY_REFS) :]
            row = rows.get_workspace(self.store, workspace_id)
            item = GcItem(
                key=f"prune_carry_ref:{project.id}:{ref}",
                action="prune_carry_ref",
                workspace_id=workspace_id,
                project_id=project.id,
                name=row.name if row else None,
                ref=ref,
                path=str(project.path),
                commit=commit,
                age_days=0.0,
                reason="work carried into a new workspace",
            )
            if not date.isdigit():
                plan.skip(item, "its commit has no date git can read: its age is unknown")
                continue
            stepped = plan.ahead(float(date))
            if stepped:
                plan.skip(item, stepped)
                continue
            age = (plan.now - float(date)) / DAY_S
            if age < days:
                continue
            if row is None:
                where = "its workspace is gone (a removal saves a workspace's work first)"
            elif row.state == "creating":
                where = "its create never finished, so the main checkout still holds it"
            else:
                where = f"it was restored into workspace {row.name!r} before it was active"
            plan.items.append(
                item.model_copy(
                    update={
                        "age_days": age,
                        "reason": f"carried {age:.1f} days ago (policy: {days:g}); {where}",
                    }
                )
            )

    # -- merged, clean, active workspaces -----------------------------------------------------

    async def _merged(self, plan: Plan) -> None:
        mains: dict[str, str] = {}  # each main checkout's HEAD, read once per plan
        for row in rows.list_workspaces(self.store, state="active"):
            if row.runtime != "worktree" or not row.base:
                continue
            project = rows.get_project(self.store, row.project_id)
            if project is None or not os.path.isdir(row.path):
                continue
            tip = await self._out(row.path, "rev-parse", "--verify", "--quiet", "HEAD")
            if project.id not in mains:
                mains[project.id] = await self._out(
                    project.path, "rev-parse", "--verify", "--quiet", "HEAD"
                )
            main = mains[project.id]
            if not tip or not main or tip == row.base:
                continue  # nothing of its own yet: a fresh workspace is not stale
            merged = await self.git.run(
                project.path, "merge-base", "--is-ancestor", tip, main, check=False
            )
            if not merged.ok:
                continue
            when = await self._out(row.path, "log", "-1", "--format=%ct", tip)
            age = max(0.0, (plan.now - float(when)) / DAY_S) if when.isdigit() else 0.0
            await self._add_workspace(
                plan,
                row,
                "archive_merged",
                age,
                reason=f"clean, and {tip[:12]} is merged into the main checkout's HEAD",
                why_not=await self.unclean(row),
            )

    async def unclean(self, row: WorkspaceRow) -> str | None:
        """Why the workspace may not be archived by gc (interrupted, unsaved, busy), or None."""
        if row.interrupted:
            return _interrupted(row)
        status = await self.git.run(
            row.path, "status", "--porcelain=v1", "-z", "--untracked-files=all", check=False
        )
        if not status.ok:
            return f"cannot tell whether it is clean ({status.describe()})"
        dirty = [e for e in status.output.text().split("\0") if e]
        if dirty:
            return f"unsaved: {len(dirty)} uncommitted or untracked path(s)"
        holders = await self.hooks.holders(
            WorkspaceRef(row.id, row.project_id, row.name, row.path, row.incarnation)
        )
        if holders:
            return f"busy: {busy_message(holders)}"
        return None

    async def _out(self, repo: Path, *args: str) -> str:
        result = await self.git.run(repo, *args, check=False)
        return result.output.text().strip() if result.ok else ""

    # -- kept copies of removed workspaces ----------------------------------------------------

    async def _kept(self, plan: Plan, days: float) -> None:
        removed = rows.tombstone_times(self.store)
        for stray in strays.scan_kept(self.store, self.paths):
            name = os.path.basename(stray.path)
            since = removed.get(name) if "." not in name else None
            if since is None:
                try:
                    since = os.lstat(stray.path).st_mtime
                except OSError:
                    continue
            age = (plan.now - since) / DAY_S
            key = f"discard_kept:{name}"
            stepped = plan.ahead(since)
            if stepped:
                plan.skipped.append(
                    GcSkipped(
                        key=key,
                        action="discard_kept",
                        workspace_id=stray.workspace_id,
                        name=name,
                        reason=stepped,
                    )
                )
                continue
            if age < days:
                continue
            figures = await self.usage.measure(stray.path) if plan.measures(key) else None
            plan.items.append(
                GcItem(
                    key=key,
                    action="discard_kept",
                    workspace_id=stray.workspace_id,
                    project_id=stray.project_id,
                    name=name,
                    path=stray.path,
                    age_days=age,
                    bytes=figures.bytes if figures else 0,
                    reason=f"kept {age:.1f} days (policy: {days:g})",
                )
            )


def _interrupted(row: WorkspaceRow) -> str | None:
    return f"interrupted: {row.interrupted_reason or 'needs a look'}" if row.interrupted else None
