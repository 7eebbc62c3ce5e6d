"""The `pool_entries` table (migration 0015): one row per warm checkout, committed before it
exists on disk and deleted in the transaction where a workspace takes it over (or once it is
dropped). The one module that names the table."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from xumd.store import Store

PREFIX = "pe_"

PREPARING = "preparing"
READY = "ready"
CLAIMING = "claiming"
STALE = "stale"


@dataclass(frozen=True, slots=True)
class EntryRow:
    id: str
    project_id: str
    path: Path
    incarnation: str
    state: str
    base_commit: str
    sparse: list[str] | None
    claimed_by: str | None
    claim_path: Path | None
    created_at: float
    updated_at: float


def _row(r: sqlite3.Row) -> EntryRow:
    return EntryRow(
        id=r["id"],
        project_id=r["project_id"],
        path=Path(r["path"]),
        incarnation=r["incarnation"],
        state=r["state"],
        base_commit=r["base_commit"],
        sparse=json.loads(r["sparse"]) if r["sparse"] is not None else None,
        claimed_by=r["claimed_by"],
        claim_path=Path(r["claim_path"]) if r["claim_path"] else None,
        created_at=r["created_at"],
        updated_at=r["updated_at"],
    )


def insert_preparing(
    store: Store,
    entry_id: str,
    *,
    project_id: str,
    path: Path,
    incarnation: str,
    base_commit: str,
    sparse: list[str] | None,
) -> None:
    now = time.time()
    store.execute(
        "INSERT INTO pool_entries (id, project_id, path, incarnation, state, base_commit, sparse,"
        " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            entry_id,
            project_id,
            str(path),
            incarnation,
            PREPARING,
            base_commit,
            json.dumps(sparse) if sparse is not None else None,
            now,
            now,
        ),
    )


def get(store: Store, entry_id: str) -> EntryRow | None:
    r = store.one("SELECT * FROM pool_entries WHERE id = ?", (entry_id,))
    return _row(r) if r is not None else None


def listed(store: Store, project_id: str | None = None) -> list[EntryRow]:
    if project_id is None:
        found = store.all("SELECT * FROM pool_entries ORDER BY created_at, id")
    else:
        found = store.all(
            "SELECT * FROM pool_entries WHERE project_id = ? ORDER BY created_at, id",
            (project_id,),
        )
    return [_row(r) for r in found]


def mark_ready(store: Store, entry_id: str) -> bool:
    cur = store.execute(
        "UPDATE pool_entries SET state = 'ready', updated_at = ?"
        " WHERE id = ? AND state = 'preparing'",
        (time.time(), entry_id),
    )
    return cur.rowcount == 1


def take_ready(
    store: Store, project_id: str, base_commit: str, sparse: list[str] | None
) -> EntryRow | None:
    """The oldest ready entry at `base_commit` made with the same cone (None: a full checkout)."""
    wanted = json.dumps(sparse) if sparse is not None else None
    r = store.one(
        "SELECT * FROM pool_entries WHERE project_id = ? AND state = 'ready' AND base_commit = ?"
        " AND sparse IS ? ORDER BY created_at, id LIMIT 1",
        (project_id, base_commit, wanted),
    )
    return _row(r) if r is not None else None


def any_ready(store: Store, project_id: str) -> bool:
    return (
        store.one(
            "SELECT 1 FROM pool_entries WHERE project_id = ? AND state = 'ready' LIMIT 1",
            (project_id,),
        )
        is not None
    )


def mark_claiming(store: Store, entry_id: str, workspace_id: str, claim_path: Path) -> bool:
    """Compare-and-set from `ready`: two creates never claim one entry."""
    cur = store.execute(
        "UPDATE pool_entries SET state = 'claiming', claimed_by = ?, claim_path = ?,"
        " updated_at = ? WHERE id = ? AND state = 'ready'",
        (workspace_id, str(claim_path), time.time(), entry_id),
    )
    return cur.rowcount == 1


def set_state(store: Store, entry_id: str, state: str) -> None:
    store.execute(
        "UPDATE pool_entries SET state = ?, claimed_by = NULL, claim_path = NULL, updated_at = ?"
        " WHERE id = ?",
        (state, time.time(), entry_id),
    )


def mark_stale_except(store: Store, project_id: str, base_commit: str) -> int:
    """Every ready entry of the project not at `base_commit` may no longer be claimed."""
    cur = store.execute(
        "UPDATE pool_entries SET state = 'stale', updated_at = ?"
        " WHERE project_id = ? AND state = 'ready' AND base_commit != ?",
        (time.time(), project_id, base_commit),
    )
    return cur.rowcount


def delete(store: Store, entry_id: str) -> None:
    store.execute("DELETE FROM pool_entries WHERE id = ?", (entry_id,))


def count_live(store: Store, project_id: str) -> int:
    """Entries that are or will be claimable: preparing and ready."""
    r = store.one(
        "SELECT COUNT(*) AS n FROM pool_entries WHERE project_id = ?"
        " AND state IN ('preparing', 'ready')",
        (project_id,),
    )
    return int(r["n"]) if r is not None else 0


def entry_paths(store: Store) -> set[str]:
    """Every entry's checkout path and, mid-claim, where it goes: paths the pool claims."""
    found: set[str] = set()
    for r in store.all("SELECT path, claim_path FROM pool_entries"):
        found.add(r["path"])
        if r["claim_path"]:
            found.add(r["claim_path"])
    return found
