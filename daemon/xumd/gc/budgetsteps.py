"""The disk budget's last two steps, when the warm pool's surplus and the rebuildable
directories do not restore it (or a project holds more than `[gc] max_workspaces`):

3. archived workspaces whose checkout is still on disk (their cleanup is pending: a retry
   waiting out its back-off, a trash entry not reclaimed yet): `collect_checkout` runs that
   cleanup now, with its own checks (a holder, unsaved work, a mount still stop it);
4. with `[gc] archive_idle_days`: active workspaces that are clean (nothing uncommitted or
   untracked), not held, and unused that long (their last lease, the newest mtime in the
   checkout): `archive_idle` archives them through `workspace.archive`, snapshot first, as a
   user's archive does.

Each part still unmet after a step is handed to the next; what no step can cover is unmet."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
from xum_protocol.models.gc import GcAction, GcBudget, GcItem

from xumd.cleanup.obligations import Obligations
from xumd.gc import rebuildable
from xumd.gc.budget import mount_of
from xumd.gc.evictplan import Activity
from xumd.gc.plan import DAY_S, Plan, Planner, workspace_item
from xumd.lifecycle import rows
from xumd.lifecycle.rows import WorkspaceRow
from xumd.processes import leases

COLLECT: GcAction = "collect_checkout"
ARCHIVE: GcAction = "archive_idle"


@dataclass(slots=True)
class _Freeing:
    row: WorkspaceRow
    bytes: int
    item: GcItem


def _item(row: WorkspaceRow, action: GcAction, reason: str, size: int, age: float) -> GcItem:
    return workspace_item(row, action, reason, age_days=age, size=size)


async def plan_lingering(
    planner: Planner, plan: Plan, parts: list[GcBudget], *, walked: bool = False
) -> list[GcBudget]:
    """Step 3: archived workspaces' lingering checkouts, largest first. The parts still
    unmet. `walked`: the budget's measurement just walked every checkout anew (its figures
    are the usage cache's), so none is walked again here."""
    if not parts:
        return []
    found: list[_Freeing] = []
    obligations = Obligations(planner.store)
    for row in rows.list_workspaces(planner.store, state="archived"):
        if not os.path.isdir(row.path):
            continue
        if not obligations.pending_for_workspace(row.id):
            plan.skip(
                _item(row, COLLECT, "archived, its checkout still on disk", 0, 0.0),
                "its cleanup has no pending step (given up: `xum cleanup status` says why)",
            )
            continue
        figures = await planner.usage.figures(row, refresh=not walked)
        size = figures.bytes if figures else 0
        reason = "archived, its checkout still on disk: its pending cleanup runs now"
        found.append(_Freeing(row, size, _item(row, COLLECT, reason, size, 0.0)))
    found.sort(key=lambda f: (-f.bytes, f.row.id))
    return _choose(plan, parts, found)


async def plan_idle_archives(
    planner: Planner,
    plan: Plan,
    parts: list[GcBudget],
    activity: Activity,
    *,
    walked: bool = False,
) -> list[GcBudget]:
    """Step 4 (`archive_idle_days`): idle clean workspaces, least recently used first. The
    parts still unmet. `walked`: as for `plan_lingering`."""
    days = planner.config.archive_idle_days
    if not parts or days <= 0:
        return parts
    found: list[_Freeing] = []
    for row in rows.list_workspaces(planner.store, state="active"):
        if not os.path.isdir(row.path):
            continue
        used = await _last_use(planner, row, activity)
        if used is None:
            continue  # held, or used after now (a clock step back): in use
        idle = plan.now - used
        if idle < days * DAY_S:
            continue
        why_not = await planner.unclean(row)
        reason = f"clean, unused for {idle / DAY_S:.1f} days ([gc] archive_idle_days)"
        if why_not:
            plan.skip(_item(row, ARCHIVE, reason, 0, idle / DAY_S), why_not)
            continue
        figures = await planner.usage.figures(row, refresh=not walked)
        size = figures.bytes if figures else 0
        found.append(_Freeing(row, size, _item(row, ARCHIVE, reason, size, idle / DAY_S)))
    found.sort(key=lambda f: (-f.item.age_days, f.row.id))
    return _choose(plan, parts, found)


async def _last_use(planner: Planner, row: WorkspaceRow, activity: Activity) -> float | None:
    """When the workspace was last used (its last lease, the newest mtime in its checkout), or
    None while it counts as in use (seen held within idle_after_s by this daemon)."""
    since = activity.since(row.id)
    if since is not None and since < planner.config.idle_after_s:
        return None
    deadline = time.monotonic() + planner.usage.config.deadline_s
    scan = await anyio.to_thread.run_sync(rebuildable.scan, Path(row.path), [], [], deadline)
    if not scan.complete:
        return None  # what is unseen may have changed just now
    return max(scan.newest, leases.last_held(planner.store, row.id) or 0.0)


def _choose(plan: Plan, parts: list[GcBudget], found: list[_Freeing]) -> list[GcBudget]:
    unmet: list[GcBudget] = []
    planned = {i.key for i in plan.items}
    for part in parts:
        need = part.deficit_bytes if part.what != "workspaces" else part.excess_workspaces
        for one in found:
            if need <= 0:
                break
            if part.what == "free" and mount_of(one.row.path) != part.filesystem:
                continue
            if part.what == "workspaces" and one.row.project_id != part.project_id:
                continue
            if one.item.key not in planned and plan.measures(one.item.key):
                plan.items.append(one.item)
                planned.add(one.item.key)
            need -= 1 if part.what == "workspaces" else one.bytes
        if need > 0:
            field = "excess_workspaces" if part.what == "workspaces" else "deficit_bytes"
            unmet.append(part.model_copy(update={field: need}))
    return unmet
