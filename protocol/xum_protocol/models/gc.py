"""Protocol models of garbage collection (`gc.plan`, `gc.run`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from xum_protocol.methods_base import MethodSpec
from xum_protocol.models.base import Params, Result

GcAction = Literal[
    "remove_archived",
    "prune_snapshot_ref",
    "prune_carry_ref",
    "archive_merged",
    "discard_kept",
    "evict_rebuildable",
    "drop_pool_entry",
    "collect_checkout",
    "archive_idle",
]


class GcItem(Result):
    """One thing a policy would collect, and what it frees."""

    key: str = Field(description="Stable id of the item (`<action>:<subject>`), for `gc.run`.")
    action: GcAction = Field(
        description="remove_archived: `workspace.remove` of an archived workspace; "
        "prune_snapshot_ref: delete a removed workspace's snapshot ref; prune_carry_ref: "
        "delete a `refs/xum/carry/<ws>` a create left (`snapshot_refs_days` after its carry; "
        "since 1.5); "
        "archive_merged: "
        "`workspace.archive` of a clean, merged workspace; discard_kept: "
        "`workspace.discard_kept` of a removed workspace's kept copy; evict_rebuildable: move "
        "an idle workspace's rebuildable directory (ignored, untracked, `[gc] rebuildable`) to "
        "the trash while a disk budget is exceeded; drop_pool_entry: delete a warm pool "
        "checkout that is stale or beyond its project's `[create] pool`; collect_checkout: "
        "run the pending cleanup of an archived workspace whose checkout is still on disk, "
        "now (while a budget is exceeded); archive_idle: `workspace.archive` of a clean "
        "workspace unused for `[gc] archive_idle_days` (while a budget is exceeded). An open "
        "set."
    )
    workspace_id: str | None = None
    project_id: str | None = None
    name: str | None = None
    path: str | None = Field(
        default=None,
        description="The checkout, the kept copy, or (evict_rebuildable) the directory evicted.",
    )
    ref: str | None = Field(default=None, description="prune_snapshot_ref: the ref.")
    commit: str | None = Field(
        default=None,
        description="prune_snapshot_ref: the commit the ref held when planned (deleted only "
        "while it still does).",
    )
    age_days: float = Field(description="How long it has been stale, by the daemon's clock.")
    bytes: int = Field(
        default=0,
        description="Allocated bytes freed on disk (checkouts, kept copies; 0 where git frees "
        "objects only at its own gc, e.g. a snapshot ref).",
    )
    reason: str = Field(description="Why the policy selects it.")


class GcSkipped(Result):
    key: str
    action: GcAction | Literal["plan"] = Field(
        description="The item's action; `plan`: a background run whose plan itself failed."
    )
    workspace_id: str | None = None
    name: str | None = None
    reason: str = Field(description="Why it is left alone (busy, unsaved work, interrupted, ...).")
    kind: str | None = Field(
        default=None, description="The refusal's error kind when a lifecycle operation refused."
    )


class GcPolicies(Result):
    """The policies in force (ROOT/config.toml `[gc]`; 0 / false: off)."""

    archived_after_days: float = 0
    snapshot_refs_days: float = 0
    archive_merged: bool = False
    kept_after_days: float = 0
    min_free_bytes: int = 0
    min_free_percent: float = 0
    max_bytes: int = 0
    rebuildable: list[str] = Field(default_factory=list)
    max_workspaces: int = 0
    archive_idle_days: float = 0


class GcBudget(Result):
    """One part of the disk budget, measured now: a filesystem's free space (`min_free_*`), or
    the root's bytes (`max_bytes`)."""

    what: Literal["free", "bytes", "workspaces"] = Field(
        description="free: a filesystem's free space against `min_free_bytes` / "
        "`min_free_percent`; bytes: the root's checkouts, trash and archive store against "
        "`max_bytes`; workspaces: a project's workspaces holding a checkout against "
        "`max_workspaces` (since 1.4)."
    )
    filesystem: str = Field(
        description="The mount point (bytes: the root's; workspaces: the project's workspaces "
        "directory)."
    )
    project_id: str | None = Field(default=None, description="workspaces: the project.")
    workspaces: int = Field(
        default=0, description="workspaces: its workspaces holding a checkout now."
    )
    excess_workspaces: int = Field(
        default=0, description="workspaces: how many more than `max_workspaces`; 0: it holds."
    )
    free_bytes: int = Field(default=0, description="Free bytes now (free only).")
    size_bytes: int = Field(default=0, description="The filesystem's size (free only).")
    used_bytes: int = Field(default=0, description="The root's bytes now (bytes only).")
    limit_bytes: int = Field(
        description="free: the free bytes to keep; bytes: the most the root may hold."
    )
    deficit_bytes: int = Field(description="Bytes to free for the budget to hold; 0: it holds.")
    pending_bytes: int = Field(
        default=0,
        description="Bytes of trash entries and reclaims already owed there (freed by the "
        "cleanup without anything more chosen).",
    )


class GcPlanParams(Params):
    budget_only: bool = Field(
        default=False,
        description="Only the disk budget, measured now (`budget`): no item is planned, no "
        "checkout walked beyond what the budget measures (`xum du`) (since 1.4, additive).",
    )


class GcPlanResult(Result):
    policies: GcPolicies
    now: float = Field(description="The daemon's clock when planned (wall time).")
    items: list[GcItem] = Field(default_factory=list)
    skipped: list[GcSkipped] = Field(default_factory=list)
    bytes: int = Field(default=0, description="The items' bytes together.")
    budget: list[GcBudget] = Field(
        default_factory=list,
        description="The disk budget measured now, part by part (empty: no budget set).",
    )
    unmet_bytes: int = Field(
        default=0,
        description="Bytes the budget still lacks after every planned item (what is left is "
        "busy, unsaved or not rebuildable).",
    )


class GcRunParams(Params):
    keys: list[str] | None = Field(
        default=None,
        max_length=10000,
        description="Only these items of a fresh plan (a key no longer planned is reported "
        "skipped: the world changed); absent: every planned item.",
    )
    background: bool = Field(
        default=False,
        description="Record the run and answer at once (`state: running`, `run_id`); the "
        "daemon collects in the background, and a run a crash or a stop cut short resumes at "
        "the next start. `gc.get` answers its result.",
    )


class GcGetParams(Params):
    run_id: str = Field(min_length=1, max_length=64)


class GcDone(Result):
    key: str
    action: GcAction
    workspace_id: str | None = None
    name: str | None = None
    bytes: int = 0
    detail: str = Field(default="", description="What the lifecycle operation answered.")


class GcRunResult(Result):
    run_id: str | None = Field(default=None, description="A background run's id.")
    state: Literal["running", "done"] = "done"
    done: list[GcDone] = Field(default_factory=list)
    skipped: list[GcSkipped] = Field(default_factory=list)
    bytes: int = Field(default=0, description="Bytes freed by the items done.")


GC_PLAN = MethodSpec(
    "gc.plan",
    GcPlanParams,
    GcPlanResult,
    "What the garbage collection policies would collect now, and the bytes freed; changes nothing.",
)
GC_RUN = MethodSpec(
    "gc.run",
    GcRunParams,
    GcRunResult,
    "Plan afresh, then collect each item through its lifecycle operation "
    "(workspace.remove / archive / discard_kept, with their reservations and checks); "
    "anything busy, unsaved or not provably stale is skipped and reported.",
    mutating=True,
)
GC_GET = MethodSpec(
    "gc.get",
    GcGetParams,
    GcRunResult,
    "A background gc run: `running`, or `done` with what it collected and skipped.",
)
