"""The gc_runs table: background gc runs, recorded `running` until their result is stored.

A module of its own (not the service) so the feature can ask whether a run was cut by the last
stop without building the service and everything it imports."""

from __future__ import annotations

import sqlite3

from xumd.store import Store


def insert_running(store: Store, run_id: str, keys: str | None, now: float) -> None:
    """Record a queued run (`keys` as JSON, or None for every policy). Inside the caller's
    transaction."""
    store.execute(
        "INSERT INTO gc_runs (id, keys, state, created_at, updated_at)"
        " VALUES (?, ?, 'running', ?, ?)",
        (run_id, keys, now, now),
    )


def get(store: Store, run_id: str) -> sqlite3.Row | None:
    """A run's state and result (JSON, once done)."""
    return store.one("SELECT state, result FROM gc_runs WHERE id = ?", (run_id,))


def oldest_running(store: Store) -> sqlite3.Row | None:
    """The oldest run still `running` (its id and keys), if any."""
    return store.one(
        "SELECT id, keys FROM gc_runs WHERE state = 'running' ORDER BY created_at, id LIMIT 1"
    )


def any_running(store: Store) -> bool:
    return store.one("SELECT 1 FROM gc_runs WHERE state = 'running' LIMIT 1") is not None


def finish(store: Store, run_id: str, result: str, now: float) -> None:
    """Store a run's result (JSON) and mark it done. Inside the caller's transaction."""
    store.execute(
        "UPDATE gc_runs SET state = 'done', result = ?, updated_at = ? WHERE id = ?",
        (result, now, run_id),
    )
