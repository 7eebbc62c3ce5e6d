"""`daemon.status` is what monitors poll: its providers run no SQL while nothing changed, and
answer fresh data at once after a change (never stale for longer than StoreMemo's second)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xumd.app import App
from xumd.store import Store
from xumd.store.memo import StoreMemo

from tests.support.inproc import installed_app


@pytest.fixture
def app(tmp_short: Path) -> Iterator[App]:
    with installed_app(tmp_short) as app:
        yield app


def details(app: App) -> dict[str, Any]:
    return {name: provider() for name, provider in app.status_providers.items()}


def count_statements(app: App) -> list[str]:
    seen: list[str] = []
    app.store._db.set_trace_callback(seen.append)
    return seen


def insert_interrupted_workspace(store: Store) -> None:
    now = time.time()
    with store.transaction():
        store.execute(
            "INSERT INTO projects (id, name, path, dev, ino, kind, created_at, updated_at)"
            " VALUES ('prj_0000000000000001', 'p', '/nowhere', 1, 1, 'git', ?, ?)",
            (now, now),
        )
        store.execute(
            "INSERT INTO workspaces (id, project_id, name, runtime, path, state, incarnation,"
            " interrupted, created_at, updated_at) VALUES ('ws_0000000000000001',"
            " 'prj_0000000000000001', 'w', 'worktree', '/nowhere/w', 'creating', 'i', 1, ?, ?)",
            (now, now),
        )


def test_polling_status_runs_no_sql_until_a_row_changes(app: App) -> None:
    first = details(app)
    assert set(first) >= {"cleanup", "recovery", "processes", "lifecycle", "rpc"}
    assert first["recovery"]["interrupted"] == 0
    seen = count_statements(app)
    for _ in range(50):
        assert details(app) == first
    assert seen == [], f"daemon.status ran SQL while nothing changed: {seen[:5]}"

    insert_interrupted_workspace(app.store)
    seen.clear()
    assert details(app)["recovery"]["interrupted"] == 1, "stale after a change"
    assert seen, "the change was not seen"


def test_memo_recomputes_after_a_change_or_its_max_age(app: App) -> None:
    now = [100.0]
    calls: list[int] = []

    def compute() -> int:
        calls.append(1)
        return len(calls)

    memo = StoreMemo(app.store, compute, max_age_s=1.0, clock=lambda: now[0])
    assert memo() == 1 and memo() == 1
    now[0] += 0.5
    assert memo() == 1
    now[0] += 0.6  # older than a second: recomputed even without a change
    assert memo() == 2
    insert_interrupted_workspace(app.store)
    assert memo() == 3
    assert memo() == 3


def test_memo_keeps_a_value_that_is_none(app: App) -> None:
    """A provider whose answer is None (nothing to report) is memoized like any other answer,
    not recomputed at every poll."""
    calls: list[int] = []

    def compute() -> None:
        calls.append(1)

    memo = StoreMemo(app.store, compute, clock=lambda: 100.0)
    for _ in range(5):
        assert memo() is None
    assert calls == [1]
    insert_interrupted_workspace(app.store)
    assert memo() is None and calls == [1, 1]
