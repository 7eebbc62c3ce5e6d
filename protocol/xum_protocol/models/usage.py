"""Protocol models of disk usage (`workspace.usage`)."""

from __future__ import annotations

from pydantic import Field

from xum_protocol.methods_base import MethodSpec
from xum_protocol.models.base import Params, Result


class WorkspaceUsageParams(Params):
    workspace_id: str | None = Field(
        default=None, max_length=200, description="One workspace; absent: all, with root totals."
    )
    refresh: bool = Field(
        default=False, description="Walk again even when a cached answer is fresh enough."
    )


class DirUsage(Result):
    path: str = Field(description="A top-level entry of the checkout (relative).")
    bytes: int = Field(description="Allocated bytes under it.")


class UsageFigures(Result):
    """One walk of a tree: allocated bytes (st_blocks * 512, so a sparse file counts what it
    holds on disk, not its length), each hard-linked file once, never across a mount."""

    bytes: int = Field(description="Allocated bytes (directories included).")
    apparent_bytes: int = Field(description="The files' lengths, for comparison.")
    files: int = Field(description="Files, symlinks and special files (not directories).")
    ignored_bytes: int = Field(
        default=0, description="Allocated bytes of ignored files (git's ignore rules)."
    )
    ignored_files: int = 0
    largest: list[DirUsage] = Field(
        default_factory=list, description="The largest top-level entries, largest first (10)."
    )
    complete: bool = Field(
        default=True,
        description="False when the walk hit its deadline (`usage.deadline_s`) or could not "
        "read something: the figures are then a lower bound (`error` says why).",
    )
    error: str | None = None
    mounts_skipped: list[str] = Field(
        default_factory=list, description="Mount points inside the tree, not walked."
    )


class WorkspaceUsage(Result):
    workspace_id: str
    project_id: str
    name: str
    state: str
    path: str
    usage: UsageFigures | None = Field(
        default=None, description="None when the workspace has no checkout on disk."
    )
    computed_at: float = Field(description="When the walk ran (wall time).")
    age_s: float = Field(description="How old the figures are (cached answers are reused).")


class RootUsage(Result):
    """The root's own stores, beyond the checkouts."""

    workspaces_bytes: int = Field(description="The checkouts listed above, together.")
    trash: UsageFigures = Field(description="ROOT/trash: checkouts moved out, not reclaimed yet.")
    archive_store: UsageFigures = Field(
        description="ROOT/archive: preserved files of archived workspaces, kept copies."
    )
    pending_reclaims: int = Field(description="Trash entries whose deletion is still pending.")
    pending_reclaim_bytes: int = Field(
        description="Their allocated bytes (those in ROOT/trash are part of `trash` too)."
    )
    pool_entries: int = Field(
        default=0, description="Warm pool checkouts (`[create] pool`), never listed as workspaces."
    )
    pool_bytes: int = Field(default=0, description="Their allocated bytes (since 1.3, additive).")
    total_bytes: int = Field(
        description="workspaces + pool + trash + archive store (+ reclaims pending outside "
        "ROOT/trash)."
    )


class WorkspaceUsageResult(Result):
    workspaces: list[WorkspaceUsage]
    root: RootUsage | None = Field(
        default=None, description="Set when asked for all workspaces (no `workspace_id`)."
    )


WORKSPACE_USAGE = MethodSpec(
    "workspace.usage",
    WorkspaceUsageParams,
    WorkspaceUsageResult,
    "Disk usage of one workspace or all (with the root's trash, archive store and pending "
    "reclaims): allocated bytes, files, the ignored share, the largest top-level entries; "
    "walked off the event loop under a deadline, cached with its age.",
)
