"""Turn rows: typed views of the `turns` table and the few writes they need.

Synchronous, used inside the caller's transaction when there is one (no await in between).
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from dataclasses import dataclass

from xumd.lifecycle import rows as workspace_rows
from xumd.store import Store

PREFIX = "turn_"

CREATING = "creating"
OPEN = "open"
ENDED = "ended"
FAILED = "failed"


def new_handle_id() -> str:
    return PREFIX + secrets.token_hex(8)


@dataclass(frozen=True, slots=True)
class TurnRow:
    id: str
    owner_workspace_id: str
    target_workspace_id: str | None
    mode: str
    state: str
    reason: str | None
    created_at: float
    updated_at: float
    ended_at: float | None
    target_interrupted: bool

    @staticmethod
    def of(row: sqlite3.Row, interrupted: set[str]) -> TurnRow:
        return TurnRow(
            id=row["id"],
            owner_workspace_id=row["owner_workspace_id"],
            target_workspace_id=row["target_workspace_id"],
            mode=row["mode"],
            state=row["state"],
            reason=row["reason"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            ended_at=row["ended_at"],
            target_interrupted=row["target_workspace_id"] in interrupted,
        )


def _typed(store: Store, found: list[sqlite3.Row]) -> list[TurnRow]:
    """The rows typed, each target's `interrupted` flag asked of the workspaces' owner (one
    query for all of them)."""
    targets = [r["target_workspace_id"] for r in found if r["target_workspace_id"]]
    interrupted = workspace_rows.interrupted_among(store, targets)
    return [TurnRow.of(r, interrupted) for r in found]


def get(store: Store, handle_id: str) -> TurnRow | None:
    found = _typed(store, store.all("SELECT * FROM turns WHERE id = ?", (handle_id,)))
    return found[0] if found else None


def for_owner(store: Store, owner_workspace_id: str) -> list[TurnRow]:
    return _typed(
        store,
        store.all(
            "SELECT * FROM turns WHERE owner_workspace_id = ? ORDER BY created_at, id",
            (owner_workspace_id,),
        ),
    )


def in_state(store: Store, state: str) -> list[TurnRow]:
    return _typed(store, store.all("SELECT * FROM turns WHERE state = ?", (state,)))


def insert(
    store: Store,
    *,
    handle_id: str,
    owner_workspace_id: str,
    target_workspace_id: str | None,
    mode: str,
    state: str,
) -> None:
    now = time.time()
    store.execute(
        "INSERT INTO turns (id, owner_workspace_id, target_workspace_id, mode, state,"
        " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (handle_id, owner_workspace_id, target_workspace_id, mode, state, now, now),
    )


def set_state(
    store: Store, handle_id: str, state: str, *, expect: str, reason: str | None = None
) -> bool:
    """Compare-and-swap on the state; False when the row moved on (a lost race)."""
    now = time.time()
    cursor = store.execute(
        "UPDATE turns SET state = ?, reason = COALESCE(?, reason), updated_at = ?,"
        " ended_at = CASE WHEN ? = 'ended' THEN ? ELSE ended_at END"
        " WHERE id = ? AND state = ?",
        (state, reason, now, state, now, handle_id, expect),
    )
    return cursor.rowcount == 1
