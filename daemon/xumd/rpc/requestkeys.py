"""Request keys: a mutating call named by its client is done once (docs/PROTOCOL.md,
"Request keys"; docs/RELIABILITY.md, "a retry after a lost answer").

The record (`request_keys`, this module's table) holds the hash of the call's params and gets
the answer's result when it is answered. A method with a settler (`workspace.create`,
`workspace.archive`) has its operation write the record, with its target, in the transaction
that commits its change (`base.requestkey`: a create's intent row, an archive's `archived`), so
after a crash the record exists exactly when the change does; any other method's record is
written before it runs. So after a crash the record and the disk agree:

- answered: a repeat with the same params gets the recorded result;
- running (in this daemon): a repeat waits for the first and gets its answer;
- cut by a crash (no result, not running): the method's settler reads the target's state as
  the startup pass left it and answers its result, or says the call did not happen (None) and
  the call runs again; a method without a settler answers `operation_failed`, saying the first
  call's outcome is unknown (never a second run that might do it twice).

An error answer is not recorded. For a method with a settler a record its operation wrote stays
unanswered, as after a crash: a repeat answers what the disk shows (an error raised after the
commit, or a call that changed nothing, which then runs again). For one without, the key is
released (an error means the call changed nothing: the contract's "no false success") and a
repeat runs it again. The same key with other params, or for another method, is
`invalid_params` naming the first call. Records older than `TTL_S` are forgotten: they are not
answered, and a bounded sweep deletes them as keyed calls come.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import orjson
from xum_protocol.errors import ErrorKind
from xum_protocol.request_keys import TTL_S

from xumd.base import logs
from xumd.base.errors import XumError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from xumd.store.db import Store

log = logs.get("xumd.rpc.requestkeys")

Settle = Callable[[Any, "str | None"], "BaseModel | None"]
"""A method's answer for a keyed call a crash cut (its params and the bound target): the result
the disk shows, or None when it did not happen (the call runs again)."""

SWEEP_EVERY_S = 600.0
SWEEP_BATCH = 500


@dataclass(slots=True)
class Running:
    """A keyed call this daemon runs now: what a repeat waits for."""

    method: str
    params_hash: str
    started_at: float
    done: anyio.Event = field(default_factory=anyio.Event)
    response: dict[str, Any] | None = None
    """The first call's answer (`result` or `error`), for the repeats that waited; None when it
    was cancelled with nothing committed (the key is released)."""


@dataclass(frozen=True, slots=True)
class Recorded:
    method: str
    params_hash: str
    target: str | None
    result: bytes | None
    created_at: float


def params_hash(params: BaseModel) -> str:
    """The params as validated (defaults filled in), canonical JSON, hashed."""
    body = orjson.dumps(params.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(body).hexdigest()


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


class RequestKeys:
    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self.running: dict[str, Running] = {}
        self._next_sweep = 0.0

    def different(self, key: str, method: str, first: str, at: float) -> XumError:
        return XumError(
            ErrorKind.INVALID_PARAMS,
            f"request_key {key!r} named another call: {first} at {_when(at)}"
            + (" with other params" if first == method else "")
            + "; a retry repeats the same call, a new call takes a new key",
            request_key=key,
            first_method=first,
            first_at=_when(at),
        )

    def recorded(self, key: str) -> Recorded | None:
        row = self.store.one(
            "SELECT method, params_hash, target, result, created_at FROM request_keys"
            " WHERE request_key = ?",
            (key,),
        )
        if row is None or row["created_at"] < self.clock() - TTL_S:
            return None
        result = row["result"]
        return Recorded(
            row["method"],
            row["params_hash"],
            row["target"],
            result.encode() if result is not None else None,
            row["created_at"],
        )

    def start(self, key: str, method: str, digest: str, *, durable: bool) -> Running:
        """The call, about to run. `durable`: recorded now (a method whose operation does not
        bind its key in its own intent transaction); else the record is written by `bind`
        in that transaction, or with the answer, and a crash before either left nothing to do
        again (one commit fewer on the way)."""
        now = self.clock()
        self._sweep(now)
        running = Running(method, digest, now)
        if durable:
            with self.store.transaction():
                self._write(key, running, None, None)
        self.running[key] = running
        return running

    def _write(self, key: str, running: Running, target: str | None, result: bytes | None) -> None:
        """The record (replacing an expired or released one); a target or result already
        written is kept when this one has none."""
        self.store.execute(
            "INSERT INTO request_keys"
            " (request_key, method, params_hash, target, result, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (request_key) DO UPDATE SET method = excluded.method,"
            " params_hash = excluded.params_hash, created_at = excluded.created_at,"
            " target = coalesce(excluded.target, target),"
            " result = coalesce(excluded.result, result)",
            (
                key,
                running.method,
                running.params_hash,
                target,
                result.decode() if result is not None else None,
                running.started_at,
            ),
        )

    def bind(self, key: str, running: Running, target: str) -> None:
        """The record with the operation's target, written in the caller's (intent)
        transaction: it commits with the operation, or not at all."""
        self._write(key, running, target, None)

    def answered(self, key: str, running: Running, result: bytes) -> None:
        with self.store.transaction():
            self._write(key, running, None, result)

    def settled(self, key: str, result: bytes) -> None:
        """The answer read from the disk for a record a crash cut."""
        with self.store.transaction():
            self.store.execute(
                "UPDATE request_keys SET result = ? WHERE request_key = ?", (result.decode(), key)
            )

    def release(self, key: str) -> None:
        """Forget the record: the call changed nothing (an error, or cancelled before any
        commit), so a repeat runs it again."""
        with self.store.transaction():
            self.store.execute("DELETE FROM request_keys WHERE request_key = ?", (key,))

    def finish(self, key: str, running: Running, response: dict[str, Any] | None) -> None:
        running.response = response
        if self.running.get(key) is running:
            del self.running[key]
        running.done.set()

    def cut(self, key: str, first: Recorded) -> XumError:
        """A method without a settler, cut by a crash before its answer was recorded."""
        return XumError(
            ErrorKind.OPERATION_FAILED,
            f"the first call with request_key {key!r} ({first.method} at "
            f"{_when(first.created_at)}) was cut by a daemon restart before its answer was "
            "recorded: whether it took effect is unknown; look at the state it would change, "
            "then repeat it with a new key if it did not",
            request_key=key,
            first_method=first.method,
            first_at=_when(first.created_at),
        )

    def _sweep(self, now: float) -> None:
        """Delete expired records, a bounded batch at most every `SWEEP_EVERY_S` (a keyed call
        pays for it; an expired record is never answered, swept or not)."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_EVERY_S
        before = self.store.changes
        with self.store.transaction():
            self.store.execute(
                "DELETE FROM request_keys WHERE rowid IN (SELECT rowid FROM request_keys"
                " WHERE created_at < ? ORDER BY created_at LIMIT ?)",
                (now - TTL_S, SWEEP_BATCH),
            )
            swept = self.store.changes - before
        if swept:
            log.info("rpc.request_keys_swept", count=swept)
