"""The disk budget, measured: for each filesystem the root's workspaces (and the root) live on,
its free space against `[gc] min_free_bytes` / `min_free_percent`; the root's bytes (checkouts,
trash, archive store) against `max_bytes`. What each part lacks is its deficit; bytes the
cleanup already owes there (trash entries, pending reclaims) count against it, since they are
freed without anything more being chosen."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from xum_protocol.models.gc import GcBudget, GcItem
from xum_protocol.models.usage import WorkspaceUsageParams

from xumd.app import App
from xumd.lifecycle import capacity, rows, views
from xumd.lifecycle.rootbytes import RootBytes
from xumd.system import diskfull
from xumd.usage.service import UsageService


@dataclass(slots=True)
class Budget:
    parts: list[GcBudget] = field(default_factory=list)

    def exceeded(self) -> list[GcBudget]:
        """The parts that lack more than what the cleanup already owes them (or a project with
        too many workspaces)."""
        return [
            p for p in self.parts if p.deficit_bytes > p.pending_bytes or p.excess_workspaces > 0
        ]

    def need(self, part: GcBudget) -> int:
        return max(0, part.deficit_bytes - part.pending_bytes)


FREEING = frozenset({"drop_pool_entry", "evict_rebuildable", "collect_checkout"})
"""The actions a budget's steps add, in the order they are tried: warm pool entries,
rebuildable directories, archived workspaces' lingering checkouts."""


def freeing(items: list[GcItem], part: GcBudget) -> int:
    """What the items already planned free towards `part` (on its filesystem, or anywhere
    under the root for `max_bytes`)."""
    return sum(
        i.bytes
        for i in items
        if i.action in FREEING
        and (part.what == "bytes" or mount_of(i.path or "/") == part.filesystem)
    )


def with_need(
    budget: Budget, mount: str, need: int, project: tuple[str, int] | None = None
) -> Budget:
    """The budget as it would be after `need` more bytes are written on `mount` (and, with
    `project` = (its id, `max_workspaces`), one more workspace of it), counting no pending
    reclaim (a create needs the space itself, not a promise of it)."""
    parts: list[GcBudget] = []
    for part in budget.parts:
        update: dict[str, int] = {"pending_bytes": 0}
        if part.what == "free" and part.filesystem == mount:
            update["deficit_bytes"] = max(0, part.limit_bytes - (part.free_bytes - need))
        elif part.what == "bytes":
            update["deficit_bytes"] = max(0, part.used_bytes + need - part.limit_bytes)
        elif part.what == "workspaces" and project is not None and part.project_id == project[0]:
            update["excess_workspaces"] = max(0, part.workspaces + 1 - project[1])
        parts.append(part.model_copy(update=update))
    return Budget(parts)


def mount_of(path: Path | str) -> str:
    """The mount point `path` is on (its nearest existing ancestor's)."""
    return diskfull.filesystem_of(path).mount


def free_part(mount: str, min_free_bytes: int, min_free_percent: float) -> GcBudget | None:
    """A filesystem's free space against the budget, or None where it cannot be read."""
    try:
        vfs = os.statvfs(mount)
    except OSError:
        return None
    size = vfs.f_blocks * vfs.f_frsize
    free = vfs.f_bavail * vfs.f_frsize
    keep = max(min_free_bytes, int(size * min_free_percent / 100))
    return GcBudget(
        what="free",
        filesystem=mount,
        free_bytes=free,
        size_bytes=size,
        limit_bytes=keep,
        deficit_bytes=max(0, keep - free),
    )


def workspace_mounts(app: App) -> dict[str, list[str]]:
    """Mount point -> the ids of the workspaces whose checkout (or, before it exists, its
    project's workspaces directory) is on it; the root's own mount is always there."""
    found: dict[str, list[str]] = {mount_of(app.paths.root): []}
    projects = {p.id: p for p in rows.list_projects(app.store)}
    for row in rows.list_workspaces(app.store):
        found.setdefault(mount_of(row.path), []).append(row.id)
    for project in projects.values():
        found.setdefault(mount_of(views.workspaces_dir(app.paths.workspaces, project)), [])
    return found


async def measure(
    app: App,
    usage: UsageService,
    mounts: dict[str, list[str]] | None = None,
    *,
    ledger: RootBytes | None = None,
    refresh: bool = False,
) -> Budget:
    """Every part of the budget set in `[gc]`, measured now (with `refresh`, every checkout
    walked anew rather than its cached figures); the root's bytes recorded in `ledger`."""
    config = app.config.gc
    budget = Budget()
    if not config.budgeted():
        return budget
    if mounts is None and (config.min_free_bytes or config.min_free_percent or config.max_bytes):
        mounts = workspace_mounts(app)
    mark = ledger.begin(mounts or ()) if ledger is not None and config.max_bytes else None
    if config.min_free_bytes or config.min_free_percent:
        owed = await _owed(usage)  # only the free space's parts tell it
        for mount in sorted(mounts or ()):
            part = free_part(mount, config.min_free_bytes, config.min_free_percent)
            if part is not None:
                budget.parts.append(part.model_copy(update={"pending_bytes": owed.get(mount, 0)}))
    if config.max_workspaces:
        budget.parts += workspace_parts(app, config.max_workspaces)
    if config.max_bytes:
        listed = await usage.usage(WorkspaceUsageParams(refresh=refresh))
        total = listed.root.total_bytes if listed.root is not None else 0
        if ledger is not None and mark is not None:
            ledger.record(mark, total)
        budget.parts.append(
            GcBudget(
                what="bytes",
                filesystem=str(app.paths.root),
                used_bytes=total,
                limit_bytes=config.max_bytes,
                deficit_bytes=max(0, total - config.max_bytes),
                # The root's walk measured the pending reclaims' sources too.
                pending_bytes=listed.root.pending_reclaim_bytes if listed.root is not None else 0,
            )
        )
    return budget


def workspace_parts(app: App, most: int) -> list[GcBudget]:
    """Each project's workspaces that hold a checkout (active, being made, archived with its
    checkout still on disk: `capacity.holding`, as a create counts them) against
    `max_workspaces`."""
    parts: list[GcBudget] = []
    for project in rows.list_projects(app.store):
        held = capacity.holding(app.store, project.id)
        parts.append(
            GcBudget(
                what="workspaces",
                filesystem=str(views.workspaces_dir(app.paths.workspaces, project)),
                project_id=project.id,
                workspaces=len(held),
                limit_bytes=0,
                deficit_bytes=0,
                excess_workspaces=max(0, len(held) - most),
            )
        )
    return parts


async def _owed(usage: UsageService) -> dict[str, int]:
    """Bytes of the trash entries pending reclaims will delete, by mount point."""
    _count, sources = usage.reclaims.pending_reclaims()
    owed: dict[str, int] = {}
    for source in sources:
        if not os.path.isdir(source):
            continue
        figures = await usage.measure(source)
        mount = mount_of(source)
        owed[mount] = owed.get(mount, 0) + figures.bytes
    return owed


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def describe(parts: list[GcBudget], unmet: list[GcBudget]) -> str:
    """The budget's state in one line (`daemon.status` details.gc.budget)."""
    if not parts:
        return "holds: nothing to measure"
    lacking = [p for p in parts if p.deficit_bytes > 0 or p.excess_workspaces > 0]
    if unmet:
        where = ", ".join(_lack(p) for p in unmet)
        return f"cannot be met: {where} (what is left is busy, unsaved or not rebuildable)"
    if lacking:
        return f"exceeded, being restored: {', '.join(_lack(p) for p in lacking)}"
    margins = [
        f"{p.filesystem} {_mb(p.free_bytes - p.limit_bytes)} above its floor"
        if p.what == "free"
        else f"the root {_mb(p.limit_bytes - p.used_bytes)} under max_bytes"
        for p in parts
        if p.what != "workspaces"
    ]
    return "holds" + (": " + ", ".join(margins) if margins else "")


def _lack(part: GcBudget) -> str:
    if part.what == "workspaces":
        return f"{part.filesystem} holds {part.excess_workspaces} workspace(s) too many"
    return f"{part.filesystem} lacks {_mb(part.deficit_bytes)}"
