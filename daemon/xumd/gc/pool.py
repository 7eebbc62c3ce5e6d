"""gc and the warm pool: every stale entry, and every entry beyond its project's `[create] pool`
(or of a project that is gone), is an item `drop_pool_entry:<entry-id>`, with no policy to turn
on (an entry holds no one's work: only the daemon's own head start). Collected through the
pool's own drop (lifecycle/pool/: the entry is marked stale first, so no claim takes it, and its
checkout goes only when its marker proves it is the entry's)."""

from __future__ import annotations

from typing import Protocol

from xum_protocol.errors import ErrorKind
from xum_protocol.models.gc import GcItem

from xumd.base.errors import XumError
from xumd.gc.budget import Budget, freeing, mount_of
from xumd.gc.plan import Plan
from xumd.lifecycle.pool.service import Surplus
from xumd.usage.service import UsageService

ACTION = "drop_pool_entry"


class PoolEntries(Protocol):
    """The pool as gc sees it (`WorkspaceService.pool_surplus`, `drop_pool_entry`,
    `pool_held_back`: the projects whose refill the budget holds back, for the status line)."""

    def pool_surplus(self) -> list[Surplus]: ...

    def pool_held_back(self) -> dict[str, str]: ...

    async def drop_pool_entry(self, entry_id: str) -> bool: ...


async def plan_items(plan: Plan, pool: PoolEntries, usage: UsageService) -> None:
    for entry in pool.pool_surplus():
        key = f"{ACTION}:{entry.entry_id}"
        figures = await usage.measure(entry.path) if plan.measures(key) else None
        plan.items.append(
            GcItem(
                key=key,
                action=ACTION,
                project_id=entry.project_id,
                name=entry.entry_id,
                path=entry.path,
                age_days=0.0,
                bytes=figures.bytes if figures else 0,
                reason=f"warm pool entry: {entry.why}",
            )
        )


async def plan_pressure(plan: Plan, budget: Budget, pool: PoolEntries, usage: UsageService) -> None:
    """While the budget is exceeded (the scheduled check, a create making room), before
    anything of a workspace: the pool's stale and surplus entries (they hold no one's work),
    until what they free covers each part's lack. A ready entry within its project's size is
    left: the refill would only write it again."""
    exceeded = budget.exceeded()
    if not exceeded:
        return
    found = [(s.entry_id, s.path, f"warm pool entry: {s.why}") for s in pool.pool_surplus()]
    planned = {i.key: i for i in plan.items}
    for part in exceeded:
        need = budget.need(part) - freeing(plan.items, part)
        for entry_id, path, why in found:
            key = f"{ACTION}:{entry_id}"
            if need <= 0:
                break
            if key in planned or (part.what == "free" and mount_of(path) != part.filesystem):
                continue
            figures = await usage.measure(path) if plan.measures(key) else None
            item = GcItem(
                key=key,
                action=ACTION,
                name=entry_id,
                path=path,
                age_days=0.0,
                bytes=figures.bytes if figures else 0,
                reason=f"{why}; {part.filesystem} lacks {need} bytes",
            )
            plan.items.append(item)
            planned[key] = item
            need -= item.bytes


async def collect(item: GcItem, pool: PoolEntries) -> str:
    entry_id = item.key.split(":", 1)[1]
    if not await pool.drop_pool_entry(entry_id):
        raise XumError(
            ErrorKind.INVALID_STATE,
            f"pool entry {entry_id} cannot be dropped now (claimed, or not provably the pool's)",
            id=entry_id,
        )
    return "dropped the warm pool entry"
