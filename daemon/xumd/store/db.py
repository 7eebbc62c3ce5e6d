"""The state store: SQLite in WAL mode with synchronous=FULL, one connection, one writer.

Every call runs on the event loop thread and is short (single-row reads and writes, indexed). That
is deliberate: a transaction never spans an `await`, so a read-check-write sequence (the
compare-and-swap on a workspace's incarnation, for example) cannot interleave with another task.
Why that is safe for the loop: the daemon is the database's only writer (the root lock), so a call
never waits on another writer except someone opening state.db by hand, and `busy_timeout` bounds
even that; WAL lets readers proceed during a write. A call or transaction slower than
`SLOW_MS` is logged (`store.slow_call`, `store.slow_transaction`), so a regression shows up in
the log instead of as a silently stalled event loop. Work that is not short (scanning a
checkout, running git) never happens inside a transaction.
Migrations are numbered SQL files applied in order; a database written by a newer schema is refused,
never overwritten.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from xumd.base import logs
from xumd.base.errors import XumError
from xumd.system import diskfull

log = logs.get("xumd.store")

SLOW_MS = 100.0
"""A store call or transaction longer than this is logged: the event loop waited that long."""
BUSY_TIMEOUT_MS = 5000

_MIGRATION_RE = re.compile(r"(\d{4})_[a-z0-9_]+\.sql")


class StoreError(Exception):
    pass


FULL_BELOW_BYTES = 256 * 1024
"""Opening the store needs room for its WAL and shared-memory files (32 KiB and up)."""


def _full_hint(path: Path) -> str:
    """Why opening may have failed when the store's filesystem is full; '' otherwise."""
    fs = diskfull.filesystem_of(path)
    no_inodes = fs.free_inodes == 0
    no_space = fs.free_bytes is not None and fs.free_bytes < FULL_BELOW_BYTES
    if not (no_inodes or no_space):
        return ""
    return (
        f" ({fs.describe()} is full{fs.free()}; SQLite needs room for its WAL and "
        "shared-memory files: free space there and start again)"
    )


def _migrations() -> list[tuple[int, str, str]]:
    found: list[tuple[int, str, str]] = []
    for entry in resources.files("xumd.store").joinpath("migrations").iterdir():
        match = _MIGRATION_RE.fullmatch(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    return found


CACHE_KIB = 256
"""SQLite's page cache for the connection. Its default (2,000 KiB) fills as the cleanup retry
and the listings read a root of thousands of rows, and stays resident for the daemon's life:
~1.7 MiB of the idle RSS with 10,000 records. The OS page cache holds the database anyway:
`workspace.list` of 10,000 rows took the same time with either (docs/PERFORMANCE.md,
"Start-up with records")."""


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._db = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=5.0
            )
        except sqlite3.Error as exc:
            raise StoreError(
                f"cannot open the state database {path}: {exc}{_full_hint(path)}"
            ) from exc
        self._db.row_factory = sqlite3.Row
        self._depth = 0
        self.slow_ms = SLOW_MS
        try:
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode != "wal":
                raise StoreError(f"{path}: cannot switch to WAL mode (got {mode})")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            self._db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        except sqlite3.DatabaseError as exc:
            self._db.close()
            hint = _full_hint(path)
            if hint:
                # Not a damaged database: SQLite cannot create its WAL and shared-memory files.
                raise StoreError(f"cannot open the state database {path}: {exc}{hint}") from exc
            raise StoreError(f"{path} is not a usable xum state database: {exc}") from exc

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def migrate(self) -> int:
        """Apply pending migrations; refuse a database from a newer xumd. Returns the version."""
        current = self.schema_version
        migrations = _migrations()
        latest = migrations[-1][0] if migrations else 0
        if current > latest:
            raise StoreError(
                f"{self.path} was written by a newer xumd (schema {current}; this xumd knows up to "
                f"{latest}); refusing to touch it. Upgrade xumd or use another --root."
            )
        for number, name, sql in migrations:
            if number <= current:
                continue
            try:
                # executescript commits any open transaction first, so BEGIN is in the script.
                self._db.executescript(
                    f"BEGIN IMMEDIATE;\n{sql}\nPRAGMA user_version={number};\nCOMMIT;"
                )
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise StoreError(f"migration {name} failed: {exc}") from exc
        return self.schema_version

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic unit; nested calls join the outer transaction."""
        if self._depth:
            self._depth += 1
            try:
                yield self._db
            finally:
                self._depth -= 1
            return
        started = time.perf_counter()
        self._run("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield self._db
        except BaseException:
            self._depth = 0
            self._rollback()
            raise
        else:
            self._depth = 0
            try:
                self._run("COMMIT")
            except BaseException:
                # A COMMIT that failed (SQLITE_FULL while writing the WAL) may leave the
                # transaction open; left so, the next BEGIN would fail until a restart.
                self._rollback()
                raise
        finally:
            self._check_slow("store.slow_transaction", started)

    def _rollback(self) -> None:
        if not self._db.in_transaction:
            return  # SQLite already rolled back (it does on some errors, SQLITE_FULL among them)
        try:
            self._db.execute("ROLLBACK")
        except sqlite3.Error as exc:
            log.error("store.rollback_failed", error=str(exc))

    def _full(self, exc: sqlite3.Error) -> XumError:
        return diskfull.disk_full(
            self.path,
            f"the state database {self.path}",
            "SQLite: database or disk is full; the change was rolled back, nothing was changed",
        )

    def _run(self, sql: str, args: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        """Execute; SQLite's "database or disk is full" becomes `disk_full` naming the store's
        filesystem (the statement, or the transaction around it, did not happen)."""
        try:
            return self._db.execute(sql, args)
        except sqlite3.Error as exc:
            if diskfull.is_sqlite_full(exc):
                raise self._full(exc) from exc
            raise

    def _check_slow(self, event: str, started: float, sql: str = "") -> None:
        ms = (time.perf_counter() - started) * 1000
        if ms > self.slow_ms:
            # The statement's text only (never its arguments: they may hold paths or names).
            log.warning(event, ms=round(ms, 2), sql=sql[:200])

    def execute(self, sql: str, args: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        started = time.perf_counter()
        try:
            return self._run(sql, args)
        finally:
            self._check_slow("store.slow_call", started, sql)

    def one(self, sql: str, args: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Row | None:
        started = time.perf_counter()
        try:
            row: sqlite3.Row | None = self._run(sql, args).fetchone()
            return row
        finally:
            self._check_slow("store.slow_call", started, sql)

    def all(self, sql: str, args: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        started = time.perf_counter()
        try:
            return list(self._run(sql, args).fetchall())
        finally:
            self._check_slow("store.slow_call", started, sql)

    def ping(self) -> bool:
        """A cheap liveness check that reads the database file (its header), not just SQLite."""
        return self._db.execute("PRAGMA user_version").fetchone() is not None

    def shrink_memory(self) -> None:
        """Free what SQLite caches for this connection (its page cache): after a pass that read
        every row, the pages would otherwise stay resident for the daemon's whole life."""
        self._db.execute("PRAGMA shrink_memory")

    @property
    def changes(self) -> int:
        """Rows inserted, updated or deleted through this connection so far (SQLite's
        `total_changes`): a value derived from the store is stale only once this moves. The
        daemon is the database's only writer (root lock), and this is its one connection."""
        return self._db.total_changes

    def close(self) -> None:
        self._db.close()
