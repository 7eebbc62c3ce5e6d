"""Protocol models of the `workspace` domain."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from xum_protocol.cursor import parse_list_cursor
from xum_protocol.methods_base import MethodSpec
from xum_protocol.models.base import Name, Params, Result
from xum_protocol.models.checkout_extras import FetchInfo, SparseInfo, SubmoduleInfo
from xum_protocol.models.cleanup import CleanupStatus
from xum_protocol.models.gc import GcDone
from xum_protocol.models.process import StoppedLeftover
from xum_protocol.models.wsenv import CopyReport, PortChange, PortTaken, env_problem

Runtime = Literal["worktree", "directory"]
WorkspaceState = Literal["creating", "active", "archiving", "archived", "restoring", "removing"]
ScriptStatus = Literal["pending", "running", "ok", "failed", "timeout", "untrusted", "none"]


class ScriptResult(Result):
    """What a setup/teardown phase did. `untrusted` carries the hash and how to trust it."""

    status: ScriptStatus
    output: str = ""
    error: str | None = None
    config_hash: str | None = None
    hint: str | None = None
    commands: int = 0
    leftovers: list[StoppedLeftover] = Field(
        default_factory=list,
        description="What its commands left running when they ended (a background job, a "
        "double fork), stopped by the daemon then. Empty: they left nothing.",
    )


class SnapshotInfo(Result):
    ref: str
    commit: str
    files: list[str] = Field(default_factory=list, description="Paths that differ from HEAD.")


SpecialFileType = Literal["fifo", "socket", "char_device", "block_device", "unknown", "changed"]


class SpecialFile(Result):
    """A file that is not a regular file, directory or symlink: never opened, never copied."""

    path: str = Field(description="Relative to the checkout.")
    type: SpecialFileType = Field(
        description="fifo | socket | char_device | block_device | unknown; `changed`: it was "
        "swapped for a special file while being copied. An open set: more may come."
    )


class DroppedInfo(Result):
    """Ignored files that the snapshot does not hold (deleted with the checkout)."""

    count: int = 0
    bytes: int = 0
    paths: list[str] = Field(default_factory=list, description="Top-level ignored paths.")
    preserved: list[str] = Field(
        default_factory=list, description="Ignored files kept in the archive store (preserve)."
    )
    special: list[SpecialFile] = Field(
        default_factory=list,
        description="Named pipes, sockets and device nodes in the checkout (since 1.0, "
        "additive): never read or saved, they go with the checkout. At most 1000 listed.",
    )


RawWhy = Literal[
    "nested_repository",
    "index_flag",
    "content_filter",
    "outside_git_view",
    "mode",
    "empty_directory",
]


class RawEntryInfo(Result):
    """An entry the snapshot cannot give back byte for byte, saved as it was in the archive
    store and written back by unarchive (docs/RELIABILITY.md, "Work git does not see")."""

    path: str = Field(description="Relative to the checkout: a file, a link or a directory.")
    why: RawWhy = Field(
        description="nested_repository (a repository inside the checkout, kept whole with its "
        "`.git`) | index_flag (assume-unchanged or skip-worktree, edited) | content_filter "
        "(a clean or smudge conversion would change its bytes) | outside_git_view (git does "
        "not list it: a path beyond PATH_MAX) | mode (the executable bit or the kind of entry "
        "differs from git's record) | empty_directory. An open set: more may come."
    )


AutoArchive = Literal["on_agent_exit"]
CarryMode = Literal["copy", "move"]


class CarryLeft(Result):
    """A carried path that `move` left in the main checkout."""

    path: str = Field(description="Relative to the main checkout.")
    reason: str = Field(
        description="Why it stayed: it changed after it was carried (its bytes, mode or index "
        "entry are not the ones carried), or git could not restore it to HEAD."
    )


class CarryInfo(Result):
    """What `workspace.create {carry}` took from the main checkout into the new one."""

    mode: CarryMode
    files: list[str] = Field(
        default_factory=list,
        description="Every path whose uncommitted state was carried (staged, unstaged, "
        "untracked; a deletion or either side of a rename counts).",
    )
    staged: list[str] = Field(
        default_factory=list, description="Of `files`, those staged in the index (kept staged)."
    )
    untracked: list[str] = Field(
        default_factory=list, description="Of `files`, those untracked (kept untracked)."
    )
    directories: list[str] = Field(
        default_factory=list,
        description="Empty directories (nothing to git) made in the new checkout too; `move` "
        "leaves them in the main checkout.",
    )
    moved: bool = Field(
        default=False,
        description="`move`: every carried path was restored to HEAD in the main checkout "
        "(its untracked files deleted). False with `copy`, or when some are `left`.",
    )
    left: list[CarryLeft] = Field(
        default_factory=list,
        description="`move`: carried paths left in the main checkout as they are now (the new "
        "checkout holds what was carried).",
    )


class AutoArchiveOutcome(Result):
    """The latest auto-archive attempt of a workspace (set when its agent exited)."""

    status: str = Field(
        description="archived | retrying | failed | gave_up | superseded (the workspace was "
        "archived and restored, a new incarnation, before a retry: left alone; since 1.0, "
        "additive). An open set: treat an unknown value as ended."
    )
    attempts: int = 0
    error: str | None = Field(default=None, description="The last attempt's error kind: message.")
    process_id: str | None = Field(default=None, description="The agent whose exit started it.")
    at: float | None = None
    next_attempt_at: float | None = Field(default=None, description="When `retrying`.")


class WorkspaceInfo(Result):
    id: str
    project_id: str
    name: str
    runtime: Runtime
    path: str
    branch: str | None
    base: str | None
    state: WorkspaceState
    incarnation: str
    interrupted: bool
    interrupted_reason: str | None = None
    setup: ScriptResult
    snapshot: SnapshotInfo | None = None
    last_cleanup: CleanupStatus | None = None
    handle_id: str | None = None
    owner_workspace_id: str | None = None
    auto_archive: AutoArchive | None = Field(
        default=None, description="When the workspace archives itself (set at create)."
    )
    auto_archive_outcome: AutoArchiveOutcome | None = None
    ports: list[int] = Field(
        default_factory=list,
        description="The workspace's ports (`XUM_PORT` is the first; since 1.0, additive): "
        "allocated at create, kept while archived, released at removal.",
    )
    named_ports: dict[str, int] = Field(
        default_factory=dict,
        description="Its named ports (the project's `[ports] names`, in order; "
        "`XUM_PORT_<NAME>` for its children): the first of `ports`, by name.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Its environment (the project's `[env]` merged with `workspace.create "
        "{env}`), given to setup, teardown and every process with the XUM_* variables.",
    )
    created_at: float
    updated_at: float


class WorkspaceCreateParams(Params):
    name_fields: ClassVar[frozenset[str]] = frozenset({"name"})

    project_id: str = Field(min_length=1, max_length=200)
    name: Name
    runtime: Runtime = "worktree"
    branch: str | None = Field(default=None, min_length=1, max_length=250)
    base: str | None = Field(default=None, min_length=1, max_length=250)
    auto_archive: AutoArchive | None = Field(
        default=None, description="Archive the workspace when its agent process exits with 0."
    )
    fetch: bool | None = Field(
        default=None,
        description="Fetch the base's remote first (under `fetch_timeout_s`); a failure or "
        "timeout refuses the create (`fetch_failed`, `timeout`) unless `allow_stale_base`. "
        "Unset: the project's `[create] fetch` (default false).",
    )
    allow_stale_base: bool = Field(
        default=False,
        description="With `fetch`: when the fetch fails, create from the local base anyway "
        "(the result's `fetch.stale` says so).",
    )
    carry: CarryMode | None = Field(
        default=None,
        description="Take the main checkout's uncommitted changes (staged, unstaged, untracked "
        "and not ignored) into the new checkout, byte for byte and verified: `copy` leaves "
        "them in the main checkout, `move` then restores those paths there to HEAD (a path "
        "changed meanwhile is left, `carried.left`). The checkout starts at the main "
        "checkout's HEAD: a `base` or existing branch elsewhere is `invalid_params`, as is "
        "runtime `directory`. `not_safe` while the main checkout is mid-merge, rebase, "
        "cherry-pick, revert, bisect or `git am`, has unmerged paths, or holds work git does "
        "not carry (a nested repository, an index flag, a content filter, a submodule with "
        "work). Since 1.3, additive.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables for its setup, teardown and processes (over the "
        "project's `[env]`): names are letters, digits and '_' (not starting with a digit), "
        "no NUL, at most 256 variables and 64 KiB; `XUM_*` is the daemon's (`invalid_params`).",
    )

    @field_validator("env")
    @classmethod
    def _env_rule(cls, value: dict[str, str]) -> dict[str, str]:
        problem = env_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class WorkspaceResult(Result):
    workspace: WorkspaceInfo
    ports_taken: list[PortTaken] = Field(
        default_factory=list,
        description="`workspace.get`: its ports that a process outside the workspace listens "
        "on now (its own children listening on them are what they are for); "
        "`workspace.reallocate_ports` replaces them.",
    )


class WorkspaceReallocatePortsParams(Params):
    workspace_id: str = Field(min_length=1, max_length=200)
    ports: list[int] | None = Field(
        default=None,
        max_length=64,
        description="The workspace's ports to replace; unset: those a process outside the "
        "workspace listens on now (`ports_taken`).",
    )


class WorkspaceReallocatePortsResult(Result):
    workspace: WorkspaceInfo
    changes: list[PortChange] = Field(
        description="Each replaced port and its replacement (same position and name). Its "
        "running processes keep the environment they started with."
    )


class WorkspaceCreateResult(Result):
    workspace: WorkspaceInfo
    setup: ScriptResult
    cleared_locks: list[str] = Field(default_factory=list)
    base_commit: str | None = Field(
        default=None, description="The commit the checkout starts from (worktree runtime)."
    )
    fetch: FetchInfo | None = Field(default=None, description="Set when the base was fetched.")
    sparse: SparseInfo | None = Field(
        default=None, description="Set when the main checkout's sparse patterns were applied."
    )
    submodules: list[SubmoduleInfo] = Field(
        default_factory=list, description="The submodules of the checkout and what was done."
    )
    ignored_copy: CopyReport = Field(
        default_factory=CopyReport,
        description="Ignored files copied from the main checkout before setup (since 1.0, "
        "additive).",
    )
    carried: CarryInfo | None = Field(
        default=None, description="Set with `carry`: what was carried (since 1.4, additive)."
    )
    pool: Literal["hit", "miss", "stale"] | None = Field(
        default=None,
        description="The warm pool (`[create] pool`): hit, a ready checkout was taken over; "
        "miss, none was ready; stale, the ready one was not at this base or not clean (a fresh "
        "checkout was made). Null when no pool is configured (since 1.4, additive).",
    )
    materialised: Literal["git", "pool", "directory"] | None = Field(
        default=None,
        description="How the checkout's files came to be: git, git's checkout wrote them "
        "(`git worktree add`; with `sparse`, the cone only); pool, a warm pool entry was taken "
        "over and no file was written; directory, the directory runtime's empty directory. The "
        "ignored files of `[create] copy` say in `ignored_copy` how many were cloned "
        "copy-on-write and how many copied. An open set: a client treats a value it does not "
        "know as a checkout made some other way. Null when not known: a keyed repeat answered "
        "from the record after a crash, or a daemon that does not report it (since 1.5, "
        "additive).",
    )
    evicted: list[GcDone] = Field(
        default_factory=list,
        description="While a disk budget is set (`[gc] min_free_*`, `max_bytes`, "
        "`max_workspaces`): what gc collected to make room for this create before its intent "
        "row (warm pool entries, idle workspaces' "
        "rebuildable directories, archived workspaces' lingering checkouts), with the bytes "
        "each freed; empty when the create fit (since 1.4, additive).",
    )


class WorkspaceSetupResult(Result):
    workspace: WorkspaceInfo
    setup: ScriptResult = Field(
        description="This run's outcome (`untrusted` again when the project's config is still "
        "not trusted: nothing ran)."
    )


LIST_PAGE_MAX = 10_000
"""The largest `limit` of one `workspace.list` page."""


class WorkspaceListParams(Params):
    """Without `limit`, every workspace that matches, in one answer (as before 1.2). With
    `limit`, a page: the answer's `next` is the `after` of the following page."""

    project_id: str | None = Field(default=None, max_length=200)
    state: WorkspaceState | None = None
    limit: int | None = Field(
        default=None,
        ge=1,
        le=LIST_PAGE_MAX,
        strict=True,
        description="At most this many workspaces (1 to 10,000; fewer when the page would pass "
        "about 4 MiB); the answer's `next` is set when more may follow. Unset: all of them "
        "(since 1.2, additive).",
    )
    after: str | None = Field(
        default=None,
        min_length=1,
        max_length=400,
        description="The `next` of the previous page (an opaque cursor): the workspaces that "
        "come after it in the listing order (creation order). Stable under creates and "
        "removals between pages: none that stayed is repeated or skipped, even when the one the "
        "cursor came from was removed, and one created meanwhile comes on a later page whatever "
        "the clock said. Since 1.2, additive.",
    )

    @field_validator("after")
    @classmethod
    def _cursor_rule(cls, value: str | None) -> str | None:
        if value is not None:
            parse_list_cursor(value)  # raises ValueError: invalid_params
        return value


class WorkspaceListResult(Result):
    workspaces: list[WorkspaceInfo]
    next: str | None = Field(
        default=None,
        description="With `limit`: the `after` of the next page when more workspaces may "
        "follow; null when this page ends the listing (since 1.2, additive).",
    )


class WorkspaceIdParams(Params):
    workspace_id: str = Field(min_length=1, max_length=200)


class WorkspaceRenameParams(Params):
    name_fields: ClassVar[frozenset[str]] = frozenset({"name"})

    workspace_id: str = Field(min_length=1, max_length=200)
    name: Name


class WorkspaceRenameResult(Result):
    workspace: WorkspaceInfo
    previous_name: str
    previous_path: str
    branch_renamed: bool


class WorkspaceArchiveParams(Params):
    workspace_id: str = Field(min_length=1, max_length=200)
    stop: bool = Field(default=False, description="Stop the daemon's own processes first.")


class WorkspaceArchiveResult(Result):
    workspace: WorkspaceInfo
    snapshot: SnapshotInfo | None
    dropped: DroppedInfo
    cleanup: CleanupStatus
    raw: list[RawEntryInfo] = Field(
        default_factory=list,
        description="Entries saved as they are, beside the snapshot (since 1.0, additive).",
    )
    stopped: list[str] = Field(
        default_factory=list,
        description="With `stop`: the ids of the daemon's processes it stopped (`process.get`); "
        "empty when there were none. It once held a fixed sentence (docs/PROTOCOL.md, "
        "versioning).",
    )


class RestoredInfo(Result):
    snapshot: SnapshotInfo | None = None
    preserved: list[str] = Field(default_factory=list)
    raw: list[str] = Field(
        default_factory=list,
        description="Entries written back as they were saved (the archive's `raw`).",
    )
    replaced: list[str] = Field(
        default_factory=list,
        description="Preserved paths where the checkout held a different file after setup "
        "(setup wrote or removed it, or the branch has it): the user's saved copy was put "
        "back over it.",
    )
    kept_at: str | None = Field(
        default=None,
        description="Set when the preserved files could not all be verified in place: their "
        "saved copy was kept there (a `kept` stray; `workspace.discard_kept` deletes it).",
    )
    unverified: list[str] = Field(
        default_factory=list, description="With `kept_at`: the files not in place."
    )
    submodules: list[SubmoduleInfo] = Field(
        default_factory=list,
        description="The checkout's submodules, initialised from the main checkout's copies "
        "as at create.",
    )
    sparse: SparseInfo | None = Field(
        default=None,
        description="Set when the workspace was a cone-mode sparse checkout when archived: the "
        "cone re-applied (its own cone as archived, widened by the directory of each "
        "`sparse_kept` path).",
    )
    sparse_kept: list[str] = Field(
        default_factory=list,
        description="Restored paths outside the archived cone that carry work (changed, "
        "untracked, or preserved): kept on disk, their directories added to the cone.",
    )


class WorkspaceUnarchiveResult(Result):
    workspace: WorkspaceInfo
    restored: RestoredInfo
    setup: ScriptResult
    ignored_copy: CopyReport = Field(
        default_factory=CopyReport,
        description="Ignored files copied from the main checkout that the archive did not "
        "preserve (since 1.0, additive).",
    )
    ports_replaced: list[PortChange] = Field(
        default_factory=list,
        description="Ports of the workspace taken meanwhile by something else, replaced by "
        "new ones (since 1.0, additive).",
    )
    evicted: list[GcDone] = Field(
        default_factory=list,
        description="While a disk budget is set: what gc collected to make room for the "
        "checkout this unarchive writes, before the workspace left `archived` (as "
        "`workspace.create`'s `evicted`); empty when it fit (since 1.5, additive).",
    )


class WorkspaceRemoveParams(Params):
    workspace_id: str = Field(min_length=1, max_length=200)
    force: bool = Field(
        default=False,
        description="Snapshot uncommitted work first, and keep ignored files matching "
        "`preserve` in a kept copy, instead of refusing `not_safe`. An archived workspace whose "
        "checkout lingers (cleanup pending) with work its archive does not hold is refused "
        "`not_safe` too; with force that work is discarded with the checkout.",
    )


class KeptInfo(Result):
    """A removed workspace's saved copy of the files it was asked to keep."""

    path: str = Field(
        description="The kept copy (a `kept` stray: `workspace.strays`; deleted only by "
        "`workspace.discard_kept`)."
    )
    files: list[str] = Field(
        default_factory=list,
        description="The files in it (relative to the checkout; under `files/`, or `content/` "
        "for the directory runtime).",
    )
    raw: list[str] = Field(
        default_factory=list,
        description="Entries kept as they were (under `raw/`): what the snapshot cannot give "
        "back byte for byte.",
    )


class WorkspaceRemoveResult(Result):
    workspace_id: str
    removed: bool
    branch: str | None
    snapshot: SnapshotInfo | None
    dropped: DroppedInfo
    cleanup: CleanupStatus
    kept: KeptInfo | None = Field(
        default=None,
        description="Where the preserved files (an archived workspace's saved copy, a "
        "directory's content with `force`) are kept; absent when there were none.",
    )
    raw: list[RawEntryInfo] = Field(
        default_factory=list,
        description="With `force`: entries the snapshot cannot give back, kept as they were "
        "in the kept copy (since 1.0, additive).",
    )


WORKSPACE_CREATE = MethodSpec(
    "workspace.create",
    WorkspaceCreateParams,
    WorkspaceCreateResult,
    "Create a workspace (git worktree on a new branch, or a plain directory).",
    mutating=True,
)
WORKSPACE_LIST = MethodSpec(
    "workspace.list",
    WorkspaceListParams,
    WorkspaceListResult,
    "Workspaces, in creation order: all of them, or with `limit` one page whose "
    "`next` is the `after` of the following page (`limit`, `after`, `next` since 1.2, "
    "additive).",
)
WORKSPACE_GET = MethodSpec("workspace.get", WorkspaceIdParams, WorkspaceResult, "One workspace.")
WORKSPACE_REALLOCATE_PORTS = MethodSpec(
    "workspace.reallocate_ports",
    WorkspaceReallocatePortsParams,
    WorkspaceReallocatePortsResult,
    "Replace ports of a workspace (by default those a process outside it took) by free ones, "
    "names kept.",
    mutating=True,
)
WORKSPACE_RENAME = MethodSpec(
    "workspace.rename",
    WorkspaceRenameParams,
    WorkspaceRenameResult,
    "Rename (journaled).",
    mutating=True,
)
WORKSPACE_ARCHIVE = MethodSpec(
    "workspace.archive",
    WorkspaceArchiveParams,
    WorkspaceArchiveResult,
    "Snapshot, archive logically, then tear down and delete the checkout.",
    mutating=True,
)
WORKSPACE_UNARCHIVE = MethodSpec(
    "workspace.unarchive",
    WorkspaceIdParams,
    WorkspaceUnarchiveResult,
    "Recreate the checkout and restore its snapshot exactly.",
    mutating=True,
)
WORKSPACE_REMOVE = MethodSpec(
    "workspace.remove",
    WorkspaceRemoveParams,
    WorkspaceRemoveResult,
    "Delete the checkout and the row; branch and snapshot refs are kept.",
    mutating=True,
)
WORKSPACE_SETUP = MethodSpec(
    "workspace.setup",
    WorkspaceIdParams,
    WorkspaceSetupResult,
    "Run an active workspace's setup again (after `project.trust`, for one whose setup was "
    "skipped as untrusted), under its exclusive reservation: `busy` while another "
    "operation on it runs (named); `invalid_state` for a workspace that is archived, "
    "interrupted, or whose checkout is missing; `not_found` once removed. Not a "
    "structural change: it neither waits for nor stops the processes already running in "
    "the workspace, and while it runs a `process.spawn` or `lease.acquire` there is "
    "`busy`. A shutdown that cuts the script answers the setup `failed`, saying why. "
    "Since 1.0, additive.",
    mutating=True,
)
WORKSPACE_KEEP = MethodSpec(
    "workspace.keep",
    WorkspaceIdParams,
    WorkspaceResult,
    "Clear the interrupted flag. A kept rename journal (a rename whose undo failed) is first "
    "settled as startup recovery would: the answer is the settled workspace (still flagged "
    "if the settle left a problem), or `invalid_state` naming why neither state is provable "
    "(journal and flag stay).",
    mutating=True,
)
