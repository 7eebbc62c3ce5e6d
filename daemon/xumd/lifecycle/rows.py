"""Project and workspace rows: typed views of the store and the few writes they need.

Every function is synchronous and runs inside the caller's transaction when there is one, so a
read-check-write (compare-and-swap on `incarnation`/`version`) cannot interleave with another task.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from xumd.checkouts.marker import WorkspaceRef
from xumd.store import Store

T = TypeVar("T")


_CONVERT: dict[str, Callable[[Any], Any]] = {"Path": Path, "bool": bool}
_COLUMNS: dict[type, list[tuple[str, Callable[[Any], Any] | None]]] = {}


def _from_row(cls: type[T], row: sqlite3.Row) -> T:
    """A row dataclass from a store row: each field by its column name, with paths as Path
    and SQLite's 0/1 as bool (the field's annotation says which). The plan is computed once
    per class: startup reads every row."""
    plan = _COLUMNS.get(cls)
    if plan is None:
        plan = _COLUMNS[cls] = [
            (f.name, _CONVERT.get(str(f.type)))
            for f in fields(cls)  # type: ignore[arg-type]
        ]
    return cls(**{name: conv(row[name]) if conv else row[name] for name, conv in plan})


@dataclass(frozen=True, slots=True)
class ProjectRow:
    id: str
    name: str
    path: Path
    dev: int
    ino: int
    kind: str
    workspaces_dir: str | None
    trusted_config_hash: str | None
    created_at: float
    updated_at: float
    git_dir: str | None
    """The git common dir (realpath) of a git project; None before it was recorded."""
    git_dev: int | None
    git_ino: int | None

    @staticmethod
    def of(row: sqlite3.Row) -> ProjectRow:
        return _from_row(ProjectRow, row)


@dataclass(frozen=True, slots=True)
class WorkspaceRow:
    id: str
    project_id: str
    name: str
    runtime: str
    path: Path
    branch: str | None
    base: str | None
    branch_created: bool
    state: str
    incarnation: str
    dev: int | None
    ino: int | None
    interrupted: bool
    interrupted_reason: str | None
    setup_status: str
    setup_output: str | None
    snapshot_ref: str | None
    snapshot_commit: str | None
    last_cleanup: str | None
    handle_id: str | None
    owner_workspace_id: str | None
    auto_archive: str | None
    auto_archive_outcome: str | None
    version: int
    created_at: float
    updated_at: float

    @staticmethod
    def of(row: sqlite3.Row) -> WorkspaceRow:
        return _from_row(WorkspaceRow, row)

    def ref(self) -> WorkspaceRef:
        return WorkspaceRef(self.id, self.project_id, self.name, self.path, self.incarnation)

    def setup_detail(self) -> dict[str, Any]:
        if not self.setup_output:
            return {}
        try:
            value = json.loads(self.setup_output)
        except ValueError:
            return {"output": self.setup_output}
        return value if isinstance(value, dict) else {}


# -- projects ----------------------------------------------------------------------------------


def get_project(store: Store, project_id: str) -> ProjectRow | None:
    row = store.one("SELECT * FROM projects WHERE id = ?", (project_id,))
    return ProjectRow.of(row) if row else None


def list_projects(store: Store) -> list[ProjectRow]:
    return [ProjectRow.of(r) for r in store.all("SELECT * FROM projects ORDER BY created_at, id")]


def insert_project(
    store: Store,
    project_id: str,
    *,
    name: str,
    path: str,
    dev: int,
    ino: int,
    kind: str,
    workspaces_dir: str | None,
    git: tuple[str, int, int] | None,
    now: float,
) -> None:
    """A new project row (`git`: its repository's common dir, device and inode, if known).
    Raises sqlite3.IntegrityError when a unique index (path, repository, name) is taken."""
    git_dir, git_dev, git_ino = git if git else (None, None, None)
    store.execute(
        "INSERT INTO projects (id, name, path, dev, ino, kind, workspaces_dir,"
        " git_dir, git_dev, git_ino, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            project_id,
            name,
            path,
            dev,
            ino,
            kind,
            workspaces_dir,
            git_dir,
            git_dev,
            git_ino,
            now,
            now,
        ),
    )


def set_project_git_identity(store: Store, project_id: str, path: str, dev: int, ino: int) -> None:
    """Record a project's repository identity, only if none is recorded yet."""
    store.execute(
        "UPDATE projects SET git_dir = ?, git_dev = ?, git_ino = ?"
        " WHERE id = ? AND git_dev IS NULL",
        (path, dev, ino, project_id),
    )


def set_trusted_config_hash(store: Store, project_id: str, digest: str | None, now: float) -> None:
    store.execute(
        "UPDATE projects SET trusted_config_hash = ?, updated_at = ? WHERE id = ?",
        (digest, now, project_id),
    )


def delete_project(store: Store, project_id: str) -> None:
    store.execute("DELETE FROM projects WHERE id = ?", (project_id,))


# -- workspaces --------------------------------------------------------------------------------


def get_workspace(store: Store, workspace_id: str) -> WorkspaceRow | None:
    row = store.one("SELECT * FROM workspaces WHERE id = ?", (workspace_id,))
    return WorkspaceRow.of(row) if row else None


def workspace_by_name(store: Store, project_id: str, name: str) -> WorkspaceRow | None:
    row = store.one(
        "SELECT * FROM workspaces WHERE project_id = ? AND name = ?", (project_id, name)
    )
    return WorkspaceRow.of(row) if row else None


LISTING_ORDER = " ORDER BY w.listing_seq"
"""The order of every workspace listing (`list_workspaces`, `workspace.list`), on `workspaces w`:
the order the daemon recorded them in (store migration 0012), which is creation order whatever
the wall clock did meanwhile."""


def workspace_filter(project_id: str | None, state: str | None) -> tuple[str, list[Any]]:
    """The WHERE clause (on `workspaces w`) and its arguments of a listing's filters, shared by
    `list_workspaces` and `workspace.list` (lifecycle/listing.py) so they select the same rows."""
    sql = " WHERE 1=1"
    args: list[Any] = []
    if project_id is not None:
        sql += " AND w.project_id = ?"
        args.append(project_id)
    if state is not None:
        sql += " AND w.state = ?"
        args.append(state)
    return sql, args


def list_workspaces(
    store: Store, project_id: str | None = None, state: str | None = None
) -> list[WorkspaceRow]:
    where, args = workspace_filter(project_id, state)
    sql = "SELECT w.* FROM workspaces w" + where + LISTING_ORDER
    return [WorkspaceRow.of(r) for r in store.all(sql, args)]


def update_workspace(
    store: Store, workspace_id: str, *, expect_incarnation: str | None = None, **fields: Any
) -> WorkspaceRow | None:
    """Update fields (bumping version); with `expect_incarnation`, only when the row still has
    that incarnation (compare-and-swap). Returns the new row, or None when nothing matched."""
    fields["updated_at"] = time.time()
    sets = ", ".join(f"{name} = ?" for name in fields)
    sql = f"UPDATE workspaces SET {sets}, version = version + 1 WHERE id = ?"
    args: list[Any] = [*fields.values(), workspace_id]
    if expect_incarnation is not None:
        sql += " AND incarnation = ?"
        args.append(expect_incarnation)
    cursor = store.execute(sql, args)
    if cursor.rowcount != 1:
        return None
    return get_workspace(store, workspace_id)


def insert_creating(
    store: Store,
    workspace_id: str,
    *,
    project_id: str,
    name: str,
    runtime: str,
    path: str,
    branch: str | None,
    base: str | None,
    branch_created: bool,
    incarnation: str,
    auto_archive: str | None,
    handle_id: str | None,
    owner_workspace_id: str | None,
    now: float,
) -> None:
    """A create's intent: the row in state `creating`, setup `pending`. Raises
    sqlite3.IntegrityError when the project already has a workspace of that name."""
    store.execute(
        "INSERT INTO workspaces (id, project_id, name, runtime, path, branch, base,"
        " branch_created, state, incarnation, setup_status, created_at, updated_at,"
        " auto_archive, handle_id, owner_workspace_id)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'creating', ?, 'pending', ?, ?, ?, ?, ?)",
        (
            workspace_id,
            project_id,
            name,
            runtime,
            path,
            branch,
            base,
            int(branch_created),
            incarnation,
            now,
            now,
            auto_archive,
            handle_id,
            owner_workspace_id,
        ),
    )


def delete_created(store: Store, workspace_id: str) -> None:
    """A create's undo: the row goes without a tombstone (it never held anything)."""
    store.execute("DELETE FROM workspaces WHERE id = ?", (workspace_id,))


def interrupted_among(store: Store, workspace_ids: Iterable[str]) -> set[str]:
    """Which of these workspaces are flagged `interrupted` (one query)."""
    wanted = sorted(set(workspace_ids))
    if not wanted:
        return set()
    marks = ", ".join("?" * len(wanted))
    return {
        r["id"]
        for r in store.all(
            f"SELECT id FROM workspaces WHERE interrupted = 1 AND id IN ({marks})",
            wanted,
        )
    }


def count_interrupted(store: Store) -> int:
    found = store.one("SELECT COUNT(*) AS n FROM workspaces WHERE interrupted = 1")
    return int(found["n"]) if found else 0


def workspace_projects(store: Store) -> dict[str, str]:
    """Every row's id and project id, in one scan (a root may hold thousands)."""
    return {r["id"]: r["project_id"] for r in store.all("SELECT id, project_id FROM workspaces")}


def workspace_summaries(store: Store) -> Iterator[sqlite3.Row]:
    """Every row's id, state, path, identity and setup status: the start-up pass's one scan,
    slimmer than whole rows on a root with thousands. Read as iterated: 10,000 rows held at
    once were a 4.7 MiB peak whose pages the allocator kept for the daemon's life."""
    return iter(store.execute("SELECT id, state, path, dev, ino, setup_status FROM workspaces"))


def workspaces_among(store: Store, ids: Iterable[str]) -> dict[str, sqlite3.Row]:
    """The id, state and project id of each of `ids` that has a row, in one query that looks
    each up by id: a start-up pass that checks a directory's names against a root of thousands
    of rows reads those names' rows only."""
    found = store.all(
        "SELECT id, state, project_id FROM workspaces WHERE id IN (SELECT value FROM json_each(?))",
        (json.dumps(list(ids)),),
    )
    return {r["id"]: r for r in found}


def is_known(store: Store, workspace_id: str) -> bool:
    """A row or a tombstone has this id."""
    found = store.one(
        "SELECT 1 FROM workspaces WHERE id = ? UNION ALL"
        " SELECT 1 FROM workspace_tombstones WHERE id = ?",
        (workspace_id, workspace_id),
    )
    return found is not None


class StoreWorkspaceRecords:
    """The rows cleanup reads (`cleanup.fence.WorkspaceRecords`)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def state_of(self, workspace_id: str) -> sqlite3.Row | None:
        return self.store.one(
            "SELECT state, incarnation FROM workspaces WHERE id = ?", (workspace_id,)
        )

    def is_tombstoned(self, workspace_id: str) -> bool:
        return is_tombstoned(self.store, workspace_id)

    def is_known(self, workspace_id: str) -> bool:
        return is_known(self.store, workspace_id)

    def live_at(self, path: str, other_than: str, states: Sequence[str]) -> sqlite3.Row | None:
        marks = ",".join("?" * len(states))
        return self.store.one(
            f"SELECT id, state FROM workspaces WHERE path = ? AND id != ? AND state IN ({marks})",
            (path, other_than, *states),
        )

    def name_and_setup(self, workspace_id: str) -> sqlite3.Row | None:
        return self.store.one(
            "SELECT name, setup_status FROM workspaces WHERE id = ?", (workspace_id,)
        )


def workspace_paths(store: Store) -> set[str]:
    """The path every row claims (read as iterated: no list of 10,000 rows at a start-up's
    strays count)."""
    return {path for (path,) in store.execute("SELECT path FROM workspaces")}


def workspace_paths_among(store: Store, paths: Iterable[str]) -> set[str]:
    """Those of `paths` a row claims, looked up by path (one query over the path index): a
    directory of thousands of checkouts is checked a chunk at a time."""
    found = store.execute(
        "SELECT path FROM workspaces WHERE path IN (SELECT value FROM json_each(?))",
        (json.dumps(list(paths)),),
    )
    return {path for (path,) in found}


def set_last_cleanup(store: Store, workspace_id: str, status: str) -> None:
    """Keep the row's `last_cleanup` (a `CleanupStatus` as JSON) current for workspace.get. Not a
    structural change: the version is not bumped. Inside the caller's transaction."""
    store.execute("UPDATE workspaces SET last_cleanup = ? WHERE id = ?", (status, workspace_id))


def set_auto_archive_outcome(store: Store, workspace_id: str, outcome: str) -> None:
    """Record the latest auto-archive attempt's outcome (JSON) on the row. Not a structural
    change: the version is not bumped. Inside the caller's transaction."""
    store.execute(
        "UPDATE workspaces SET auto_archive_outcome = ? WHERE id = ?", (outcome, workspace_id)
    )


# -- rename journals (a rename's durable write order; at most one per workspace) -------------------


def insert_rename_journal(
    store: Store, old: WorkspaceRow, *, name: str, path: str, branch: str | None, now: float
) -> None:
    """A rename's intent (from `old`'s name, path and branch to these), before any move. Inside
    the caller's transaction."""
    store.execute(
        "INSERT INTO rename_journal (workspace_id, from_name, to_name, from_path,"
        " to_path, from_branch, to_branch, incarnation, phase, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'intent', ?)",
        (old.id, old.name, name, str(old.path), path, old.branch, branch, old.incarnation, now),
    )


def set_rename_phase(store: Store, workspace_id: str, phase: str) -> None:
    store.execute(
        "UPDATE rename_journal SET phase = ? WHERE workspace_id = ?", (phase, workspace_id)
    )


def rename_journal(store: Store, workspace_id: str) -> sqlite3.Row | None:
    return store.one("SELECT * FROM rename_journal WHERE workspace_id = ?", (workspace_id,))


def has_rename_journal(store: Store, workspace_id: str) -> bool:
    found = store.one("SELECT 1 FROM rename_journal WHERE workspace_id = ?", (workspace_id,))
    return found is not None


def rename_journals(store: Store) -> list[sqlite3.Row]:
    return store.all("SELECT * FROM rename_journal")


def drop_rename_journal(store: Store, workspace_id: str) -> None:
    store.execute("DELETE FROM rename_journal WHERE workspace_id = ?", (workspace_id,))


def delete_workspace_with_tombstone(store: Store, row: WorkspaceRow) -> None:
    drop_rename_journal(store, row.id)
    store.execute("DELETE FROM workspaces WHERE id = ?", (row.id,))
    store.execute(
        "INSERT OR REPLACE INTO workspace_tombstones"
        " (id, project_id, name, branch, snapshot_ref, removed_at) VALUES (?, ?, ?, ?, ?, ?)",
        (row.id, row.project_id, row.name, row.branch, row.snapshot_ref, time.time()),
    )


def tombstone_times(store: Store) -> dict[str, float]:
    """When each removed workspace was removed, by its id."""
    return {
        str(r["id"]): float(r["removed_at"])
        for r in store.all("SELECT id, removed_at FROM workspace_tombstones")
    }


def tombstone(store: Store, workspace_id: str) -> sqlite3.Row | None:
    """A removed workspace's tombstone (its project id and name among the columns), if any."""
    return store.one(
        "SELECT id, project_id, name FROM workspace_tombstones WHERE id = ?", (workspace_id,)
    )


def is_tombstoned(store: Store, workspace_id: str) -> bool:
    return store.one("SELECT 1 FROM workspace_tombstones WHERE id = ?", (workspace_id,)) is not None


# The state a removal began from (table `workspace_removing`).
#
# A `removing` row means the removal's intent committed and nothing was deleted yet: a crash or a
# failure there rolls it back to the very state it was removed from (recovery/reconcile.py). A
# flagged one (interrupted: a creation never kept, or an active or archived workspace flagged by
# an earlier recovery) keeps its flag and reason, so the user resolves it as before; one that was
# not flagged is flagged by a crash (the removal was interrupted). That state is recorded here in
# the intent's transaction: the row itself only says `removing`. Without a record (a removal
# begun by an older daemon) the checkout decides.
def record_removal_prior(store: Store, workspace_id: str, state: str) -> None:
    """Inside the transaction that commits `removing` (replaces an earlier removal's record)."""
    store.execute(
        "INSERT OR REPLACE INTO workspace_removing (workspace_id, prior_state) VALUES (?, ?)",
        (workspace_id, state),
    )


def removal_prior_state(store: Store, workspace_id: str) -> str | None:
    """The state the workspace's last removal began from; None when none was recorded (a
    removal begun by a daemon older than this record)."""
    found = store.one(
        "SELECT prior_state FROM workspace_removing WHERE workspace_id = ?", (workspace_id,)
    )
    return str(found["prior_state"]) if found is not None else None
