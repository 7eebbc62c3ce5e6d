"""Migrations: numbered densely, applied in order, refused when the database is newer."""

from __future__ import annotations

from pathlib import Path

from xumd.store import Store
from xumd.store.db import _migrations


def test_migration_numbers_are_dense() -> None:
    # A gap or a lower number added later would be skipped on databases already past it.
    numbers = [number for number, _, _ in _migrations()]
    assert numbers == list(range(1, len(numbers) + 1)), numbers


def test_a_fresh_database_reaches_the_latest_version(tmp_short: Path) -> None:
    store = Store(tmp_short / "state.db")
    try:
        assert store.migrate() == _migrations()[-1][0]
        assert store.migrate() == _migrations()[-1][0]  # idempotent
    finally:
        store.close()
