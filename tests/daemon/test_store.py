"""The store: WAL, synchronous=FULL, migrations, newer schema refused, slow calls logged."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import structlog
from xumd.store import Store, StoreError
from xumd.store.db import _migrations

LATEST = _migrations()[-1][0]


def test_pragmas_and_migrations(tmp_short: Path) -> None:
    store = Store(tmp_short / "state.db")
    try:
        assert store.one("PRAGMA journal_mode")[0] == "wal"
        assert store.one("PRAGMA synchronous")[0] == 2  # FULL
        assert store.one("PRAGMA foreign_keys")[0] == 1
        assert store.migrate() == LATEST >= 1
        assert store.migrate() == LATEST  # idempotent
        assert store.one("SELECT count(*) FROM meta")[0] == 0
    finally:
        store.close()


def test_newer_schema_is_refused_untouched(tmp_short: Path) -> None:
    path = tmp_short / "state.db"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={LATEST + 1}")
    db.close()
    store = Store(path)
    try:
        with pytest.raises(StoreError, match="newer xumd"):
            store.migrate()
        assert store.schema_version == LATEST + 1
    finally:
        store.close()


def test_not_a_database_is_a_clear_error(tmp_short: Path) -> None:
    path = tmp_short / "state.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a usable xum state database"):
        Store(path)


def test_transaction_is_atomic_and_nests(tmp_short: Path) -> None:
    store = Store(tmp_short / "state.db")
    store.migrate()
    try:
        with pytest.raises(RuntimeError), store.transaction() as db:
            db.execute("INSERT INTO meta VALUES ('a', '1')")
            with store.transaction() as inner:
                inner.execute("INSERT INTO meta VALUES ('b', '2')")
            raise RuntimeError("boom")
        assert store.all("SELECT * FROM meta") == []
        with store.transaction() as db:
            db.execute("INSERT INTO meta VALUES ('a', '1')")
        assert store.one("SELECT value FROM meta WHERE key = 'a'")[0] == "1"
    finally:
        store.close()


def test_slow_calls_are_logged_without_arguments(tmp_short: Path) -> None:
    store = Store(tmp_short / "state.db")
    store.migrate()
    store.slow_ms = -1  # everything counts as slow
    try:
        with structlog.testing.capture_logs() as logs:
            store.execute("INSERT INTO meta VALUES (?, ?)", ("secret-key", "secret-value"))
            with store.transaction() as db:
                db.execute("DELETE FROM meta")
        events = [entry["event"] for entry in logs]
        assert "store.slow_call" in events and "store.slow_transaction" in events
        assert "secret" not in repr(logs)
    finally:
        store.close()
