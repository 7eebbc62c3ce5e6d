"""Planning evictions while a disk budget is exceeded: the rebuildable directories of idle
workspaces, least recently used first, until what they free covers what the budget lacks.

Idleness is measured, never guessed from one clock: a workspace is in use while anything holds
it (a lease, a process, a mount: the lifecycle's quiescence check), for `[gc] idle_after_s` of
the monotonic clock after the daemon last saw it held (`Activity`, immune to wall-clock steps),
for `idle_after_s` after its last lease went as the store records it (processes/leases.py
`last_held`: a lease released or reclaimed, across restarts), and while a file in its checkout
outside the rebuildable directories changed within `idle_after_s` of the gc clock's now
(`GcClock`: a step ahead does not age anything; a stamp after now, left by a step back, is "in
use" until the clock passes it). The least recently used is the one whose last use (its last
lease, its newest mtime) is oldest. Each workspace and directory left out is listed skipped,
with why."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from xum_protocol.models.gc import GcBudget, GcItem

from xumd.checkouts.marker import WorkspaceRef
from xumd.gc import rebuildable
from xumd.gc.budget import Budget, freeing, mount_of
from xumd.gc.plan import DAY_S, Plan, Planner
from xumd.lifecycle import rows
from xumd.lifecycle.hooks import busy_message
from xumd.lifecycle.rows import WorkspaceRow
from xumd.lifecycle.scripts import preserve_globs
from xumd.processes import leases

ACTION = "evict_rebuildable"


@dataclass(slots=True)
class Activity:
    """When the daemon last saw each workspace held (monotonic seconds)."""

    seen: dict[str, float] = field(default_factory=dict)

    def held(self, workspace_id: str) -> None:
        self.seen[workspace_id] = time.monotonic()

    def since(self, workspace_id: str) -> float | None:
        """Seconds since it was last seen held; None: never (by this daemon)."""
        at = self.seen.get(workspace_id)
        return None if at is None else time.monotonic() - at


@dataclass(slots=True)
class _Candidate:
    row: WorkspaceRow
    mount: str
    scan: rebuildable.Scan
    patterns: list[str]
    used: float
    """Its last use: the newest of its last lease and its newest mtime outside them."""


def _key(workspace_id: str, rel: str | None = None) -> str:
    return f"{ACTION}:{workspace_id}" + (f":{rel}" if rel else "")


def _item(row: WorkspaceRow, rel: str | None, reason: str) -> GcItem:
    return GcItem(
        key=_key(row.id, rel),
        action=ACTION,
        workspace_id=row.id,
        project_id=row.project_id,
        name=row.name,
        path=str(row.path / rel) if rel else str(row.path),
        age_days=0.0,
        reason=reason,
    )


async def plan_evictions(
    planner: Planner, plan: Plan, budget: Budget, activity: Activity
) -> list[GcBudget]:
    """Add evictions to `plan` for each exceeded part of `budget`; the parts still unmet."""
    exceeded = budget.exceeded()
    if not exceeded:
        return []
    mounts = {m for p in exceeded if p.what == "free" for m in [p.filesystem]}
    anywhere = any(p.what == "bytes" for p in exceeded)
    candidates: list[_Candidate] = []
    for row in rows.list_workspaces(planner.store, state="active"):
        if row.runtime != "worktree" or not os.path.isdir(row.path):
            continue
        mount = mount_of(row.path)
        if not anywhere and mount not in mounts:
            continue
        candidate = await _candidate(planner, plan, row, mount, activity)
        if candidate is not None:
            candidates.append(candidate)
    # Least recently used first: the oldest last use (a lease, a change outside the
    # rebuildable directories).
    candidates.sort(key=lambda c: (c.used, c.row.id))
    unmet: list[GcBudget] = []
    taken: set[str] = set()
    for part in exceeded:
        need = budget.need(part) - freeing(plan.items, part)
        for candidate in candidates:
            if need <= 0:
                break
            if part.what == "free" and candidate.mount != part.filesystem:
                continue
            for rel, found in sorted(candidate.scan.dirs.items()):
                key = _key(candidate.row.id, rel)
                if need <= 0 or key in taken or found.mount or found.preserved:
                    continue
                if await rebuildable.tracked(planner.git, candidate.row.path, rel):
                    plan.skip(_item(candidate.row, rel, "rebuildable"), "git tracks paths under it")
                    continue
                idle = (plan.now - candidate.used) if candidate.used else None
                since = f"idle {idle / DAY_S:.1f} days" if idle is not None else "idle"
                item = _item(
                    candidate.row,
                    rel,
                    f"rebuildable ({', '.join(candidate.patterns)}); workspace {since};"
                    f" {part.filesystem} lacks {need} bytes"
                    + (" of free space" if part.what == "free" else " under [gc] max_bytes"),
                ).model_copy(update={"bytes": found.bytes, "age_days": (idle or 0.0) / DAY_S})
                taken.add(key)
                if plan.measures(key):
                    plan.items.append(item)
                need -= found.bytes
        if need > 0:
            unmet.append(part.model_copy(update={"deficit_bytes": need, "pending_bytes": 0}))
    return unmet


async def _candidate(
    planner: Planner, plan: Plan, row: WorkspaceRow, mount: str, activity: Activity
) -> _Candidate | None:
    """The workspace's rebuildable directories, measured, if it is idle; else skipped."""
    config = planner.config
    whole = _item(row, None, "rebuildable directories")
    if row.interrupted:
        plan.skip(whole, f"interrupted: {row.interrupted_reason or 'needs a look'}")
        return None
    project = rows.get_project(planner.store, row.project_id)
    if project is None:
        return None
    patterns = list(config.rebuildable) + rebuildable.project_patterns(project.path)
    if not patterns:
        return None
    holders = await planner.hooks.holders(
        WorkspaceRef(row.id, row.project_id, row.name, row.path, row.incarnation)
    )
    if holders:
        activity.held(row.id)
        plan.skip(whole, f"busy: {busy_message(holders)}")
        return None
    since = activity.since(row.id)
    if since is not None and since < config.idle_after_s:
        plan.skip(whole, f"in use: held {since:.0f} s ago ([gc] idle_after_s)")
        return None
    held_at = leases.last_held(planner.store, row.id)
    stepped = plan.ahead(held_at) if held_at else None
    if stepped:
        plan.skip(whole, f"in use: its last lease went at {stepped}")
        return None
    if held_at and plan.now - held_at < config.idle_after_s:
        plan.skip(
            whole,
            f"in use: its last lease went {plan.now - held_at:.0f} s ago ([gc] idle_after_s)",
        )
        return None
    try:
        rels = await rebuildable.directories(planner.git, row.path, patterns)
    except Exception as exc:  # a listing that failed offers nothing, and says why
        plan.skip(whole, f"cannot list its ignored directories: {exc}")
        return None
    if not rels:
        return None
    globs = preserve_globs(row.path, project.path)
    deadline = time.monotonic() + planner.usage.config.deadline_s
    scan = await anyio.to_thread.run_sync(rebuildable.scan, Path(row.path), rels, globs, deadline)
    if not scan.complete:
        plan.skip(whole, f"not fully walked ({scan.error}): what is unseen is not known safe")
        return None
    stepped = plan.ahead(scan.newest) if scan.newest else None
    if stepped:
        plan.skip(whole, f"in use: a file's mtime is {stepped}")
        return None
    if scan.newest and plan.now - scan.newest < config.idle_after_s:
        plan.skip(
            whole,
            f"in use: a file changed {plan.now - scan.newest:.0f} s ago ([gc] idle_after_s)",
        )
        return None
    for rel, found in scan.dirs.items():
        if found.mount:
            plan.skip(
                _item(row, rel, "rebuildable"), f"mount at {found.mount} inside: never evicted"
            )
        elif found.preserved or rebuildable.preserved(rel, globs):
            found.preserved = found.preserved or rel
            plan.skip(
                _item(row, rel, "rebuildable"),
                f"`preserve` names {found.preserved}: kept work, never evicted",
            )
    return _Candidate(row, mount, scan, patterns, max(scan.newest, held_at or 0.0))
