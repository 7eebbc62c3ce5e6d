"""Store access for cleanup obligations: typed rows and the few reads and writes the service needs.

Every function is synchronous and short; writes run in their own transaction or join the caller's
(`plan` must join the caller's, so a logical state change and its obligations commit together).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from xum_protocol.models.cleanup import Obligation

from xumd.store import Store

PREFIX = "ob_"
PENDING = "pending"
COMPLETED = "completed"
ABANDONED = "abandoned"
FAILED = "failed"

ERROR_LIMIT = 4000
"""last_error keeps at most this many characters: the head line and the diagnostic tail."""


def new_id() -> str:
    return PREFIX + secrets.token_hex(8)


def bound_error(text: str, limit: int = ERROR_LIMIT) -> str:
    """Keep the first line (what failed) and the tail (why), dropping the middle."""
    if len(text) <= limit:
        return text
    head, _, _ = text.partition("\n")
    head = head[: limit // 4]
    marker = "\n[...]\n"
    return head + marker + text[-(limit - len(head) - len(marker)) :]


@dataclass(frozen=True, slots=True)
class ObligationRow:
    id: str
    workspace_id: str
    project_id: str
    kind: str
    seq: int
    path: str
    dev: int | None
    ino: int | None
    incarnation: str
    state: str
    attempts: int
    next_attempt_at: float
    last_error: str | None
    reason: str | None
    detail: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0

    @staticmethod
    def due_now(
        *,
        id: str,
        workspace_id: str,
        project_id: str,
        kind: str,
        seq: int,
        path: str,
        dev: int | None,
        ino: int | None,
        incarnation: str,
        detail: dict[str, Any],
        now: float,
    ) -> ObligationRow:
        """A newly planned step: pending, never attempted, due at once."""
        return ObligationRow(
            id=id,
            workspace_id=workspace_id,
            project_id=project_id,
            kind=kind,
            seq=seq,
            path=path,
            dev=dev,
            ino=ino,
            incarnation=incarnation,
            state=PENDING,
            attempts=0,
            next_attempt_at=now,
            last_error=None,
            reason=None,
            detail=detail,
            created_at=now,
            updated_at=now,
        )

    @staticmethod
    def of(row: sqlite3.Row) -> ObligationRow:
        try:
            detail = json.loads(row["detail"] or "{}")
        except ValueError:
            detail = {}
        return ObligationRow(
            id=row["id"],
            workspace_id=row["workspace_id"],
            project_id=row["project_id"],
            kind=row["kind"],
            seq=row["seq"],
            path=row["path"],
            dev=row["dev"],
            ino=row["ino"],
            incarnation=row["incarnation"],
            state=row["state"],
            attempts=row["attempts"],
            next_attempt_at=row["next_attempt_at"],
            last_error=row["last_error"],
            reason=row["reason"],
            detail=detail if isinstance(detail, dict) else {},
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )

    @property
    def identity(self) -> tuple[int, int] | None:
        return (self.dev, self.ino) if self.dev is not None and self.ino is not None else None

    def as_json(self) -> dict[str, Any]:
        """`self.model().model_dump(mode="json")`, written without building the model
        (`daemon.status`'s cleanup details; tests/cleanup/test_status_details.py compares)."""
        bytes_ = self.detail.get("bytes")
        due = self.next_attempt_at if self.state == PENDING else None
        return {
            "id": self.id,
            "workspace_id": self.workspace_id,
            "project_id": self.project_id,
            "kind": self.kind,
            "seq": self.seq,
            "path": self.path,
            "incarnation": self.incarnation,
            "state": self.state,
            "attempts": self.attempts,
            "next_attempt_at": float(due) if due is not None else None,
            "last_error": self.last_error,
            "reason": self.reason,
            "bytes": int(bytes_) if isinstance(bytes_, int) else None,
            "detail": self.detail,
            "created_at": float(self.created_at),
            "updated_at": float(self.updated_at),
        }

    def model(self) -> Obligation:
        bytes_ = self.detail.get("bytes")
        return Obligation(
            id=self.id,
            workspace_id=self.workspace_id,
            project_id=self.project_id,
            kind=self.kind,
            seq=self.seq,
            path=self.path,
            incarnation=self.incarnation,
            state=self.state,
            attempts=self.attempts,
            next_attempt_at=self.next_attempt_at if self.state == PENDING else None,
            last_error=self.last_error,
            reason=self.reason,
            bytes=bytes_ if isinstance(bytes_, int) else None,
            detail=self.detail,
            created_at=self.created_at,
            updated_at=self.updated_at,
        )


class Obligations:
    def __init__(self, store: Store) -> None:
        self.store = store

    # -- reads -----------------------------------------------------------------------------------

    def get(self, obligation_id: str) -> ObligationRow | None:
        row = self.store.one("SELECT * FROM cleanup_obligations WHERE id = ?", (obligation_id,))
        return ObligationRow.of(row) if row else None

    def for_workspace(self, workspace_id: str) -> list[ObligationRow]:
        rows = self.store.all(
            "SELECT * FROM cleanup_obligations WHERE workspace_id = ? ORDER BY seq, created_at",
            (workspace_id,),
        )
        return [ObligationRow.of(r) for r in rows]

    def pending_for_workspace(self, workspace_id: str) -> list[ObligationRow]:
        rows = self.store.all(
            "SELECT * FROM cleanup_obligations WHERE workspace_id = ? AND state = 'pending' "
            "ORDER BY seq, created_at",
            (workspace_id,),
        )
        return [ObligationRow.of(r) for r in rows]

    def next_seq(self, workspace_id: str) -> int:
        row = self.store.one(
            "SELECT MAX(seq) AS m FROM cleanup_obligations WHERE workspace_id = ?", (workspace_id,)
        )
        return 0 if row is None or row["m"] is None else int(row["m"]) + 1

    def siblings(self, ob: ObligationRow) -> list[ObligationRow]:
        """Obligations (any workspace, any state) recorded for the same directory identity."""
        rows = self.store.all(
            "SELECT * FROM cleanup_obligations WHERE path = ? AND dev IS ? AND ino IS ? "
            "AND kind != 'reclaim'",
            (ob.path, ob.dev, ob.ino),
        )
        return [ObligationRow.of(r) for r in rows]

    def blocking_teardown(self, ob: ObligationRow) -> ObligationRow | None:
        """A pending teardown of the same directory (any workspace) that must run before `ob`
        deletes it: every sibling's teardown runs before the single deletion."""
        row = self.store.one(
            "SELECT * FROM cleanup_obligations WHERE path = ? AND dev IS ? AND ino IS ? "
            "AND kind = 'teardown' AND state = 'pending' AND id != ? "
            "ORDER BY next_attempt_at LIMIT 1",
            (ob.path, ob.dev, ob.ino, ob.id),
        )
        return ObligationRow.of(row) if row else None

    def due_workspaces(
        self, now: float, kinds: Sequence[str], *, after: str | None, limit: int
    ) -> list[str]:
        """Workspaces with a due pending obligation of `kinds`, in id order after the cursor
        (None: from the start; orphan trash entries have the empty workspace id)."""
        marks = ",".join("?" * len(kinds))
        rows = self.store.all(
            "SELECT DISTINCT workspace_id FROM cleanup_obligations "
            f"WHERE state = 'pending' AND (? IS NULL OR workspace_id > ?) AND kind IN ({marks}) "
            "AND next_attempt_at <= ? ORDER BY workspace_id LIMIT ?",
            (after, after, *kinds, now, limit),
        )
        return [r["workspace_id"] for r in rows]

    def next_due(self, kinds: Sequence[str]) -> float | None:
        marks = ",".join("?" * len(kinds))
        row = self.store.one(
            "SELECT MIN(next_attempt_at) AS t FROM cleanup_obligations "
            f"WHERE state = 'pending' AND kind IN ({marks})",
            tuple(kinds),
        )
        return None if row is None or row["t"] is None else float(row["t"])

    def unfinished_paths(self) -> set[str]:
        """The path of every step not finished (pending, or failed and owed again)."""
        rows = self.store.execute(
            "SELECT path FROM cleanup_obligations WHERE state IN ('pending', 'failed')"
        )
        return {path for (path,) in rows}

    def unfinished_paths_among(self, paths: Iterable[str]) -> set[str]:
        """Those of `paths` a step not finished names (one query over the path index)."""
        rows = self.store.execute(
            "SELECT path FROM cleanup_obligations WHERE state IN ('pending', 'failed')"
            " AND path IN (SELECT value FROM json_each(?))",
            (json.dumps(list(paths)),),
        )
        return {path for (path,) in rows}

    def pending_ids(self, kind: str) -> list[str]:
        rows = self.store.all(
            "SELECT id FROM cleanup_obligations WHERE kind = ? AND state = 'pending'", (kind,)
        )
        return [str(r["id"]) for r in rows]

    def owed_teardowns(self, project_id: str) -> list[str]:
        """The workspaces of a project whose teardown is still pending, sorted."""
        rows = self.store.all(
            "SELECT DISTINCT workspace_id FROM cleanup_obligations"
            " WHERE project_id = ? AND kind = 'teardown' AND state = 'pending'",
            (project_id,),
        )
        return sorted(r["workspace_id"] for r in rows)

    def list(
        self, *, workspace_id: str | None, state: str | None, limit: int
    ) -> list[ObligationRow]:
        where: list[str] = []
        args: list[Any] = []
        if workspace_id is not None:
            where.append("workspace_id = ?")
            args.append(workspace_id)
        if state is not None:
            where.append("state = ?")
            args.append(state)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self.store.all(
            f"SELECT * FROM cleanup_obligations {clause} "
            "ORDER BY created_at, workspace_id, seq LIMIT ?",
            (*args, limit),
        )
        return [ObligationRow.of(r) for r in rows]

    def count(self, state: str) -> int:
        row = self.store.one(
            "SELECT COUNT(*) AS n FROM cleanup_obligations WHERE state = ?", (state,)
        )
        return int(row["n"]) if row else 0

    def oldest_pending(self) -> ObligationRow | None:
        row = self.store.one(
            "SELECT * FROM cleanup_obligations WHERE state = 'pending' "
            "ORDER BY created_at, seq LIMIT 1"
        )
        return ObligationRow.of(row) if row else None

    def referenced_trash_paths(self) -> set[str]:
        """Trash entries a pending obligation will still act on: a pending trash or reclaim's
        own `trash_path`, and the entry of the (completed) trash step a pending reclaim names
        by `trash_ob` (without it, every restart adopted a pending reclaim's entry as an orphan,
        and the two reclaims raced over one tree, the workspace's reporting 0 bytes)."""
        rows = self.store.all(
            "SELECT detail FROM cleanup_obligations WHERE state = 'pending' "
            "AND kind IN ('trash', 'reclaim')"
        )
        found: set[str] = set()
        steps: list[str] = []
        for r in rows:
            try:
                detail = json.loads(r["detail"])
                path = detail.get("trash_path")
                step = detail.get("trash_ob")
            except (ValueError, AttributeError):
                continue
            if isinstance(path, str):
                found.add(path)
            elif isinstance(step, str):
                steps.append(step)
        for start in range(0, len(steps), 500):  # bounded statements
            batch = steps[start : start + 500]
            marks = ",".join("?" * len(batch))
            for r in self.store.all(
                f"SELECT detail FROM cleanup_obligations WHERE id IN ({marks})", tuple(batch)
            ):
                try:
                    path = json.loads(r["detail"]).get("trash_path")
                except (ValueError, AttributeError):
                    continue
                if isinstance(path, str):
                    found.add(path)
        return found

    # -- writes ----------------------------------------------------------------------------------

    def insert(self, row: ObligationRow) -> None:
        self.store.execute(
            "INSERT INTO cleanup_obligations (id, workspace_id, project_id, kind, seq, path, dev, "
            "ino, incarnation, state, attempts, next_attempt_at, last_error, reason, detail, "
            "created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                row.id,
                row.workspace_id,
                row.project_id,
                row.kind,
                row.seq,
                row.path,
                row.dev,
                row.ino,
                row.incarnation,
                row.state,
                row.attempts,
                row.next_attempt_at,
                row.last_error,
                row.reason,
                json.dumps(row.detail, sort_keys=True),
                row.created_at,
                row.updated_at,
            ),
        )

    def _update(self, ob: ObligationRow, now: float, **changes: Any) -> ObligationRow:
        """Write `changes` to a still-pending row; returns the row as stored."""
        new = replace(ob, updated_at=now, **changes)
        with self.store.transaction():
            cur = self.store.execute(
                "UPDATE cleanup_obligations SET state = ?, attempts = ?, next_attempt_at = ?, "
                "last_error = ?, reason = ?, detail = ?, updated_at = ? "
                "WHERE id = ? AND state = 'pending'",
                (
                    new.state,
                    new.attempts,
                    new.next_attempt_at,
                    new.last_error,
                    new.reason,
                    json.dumps(new.detail, sort_keys=True),
                    new.updated_at,
                    ob.id,
                ),
            )
            if cur.rowcount != 1:
                stored = self.get(ob.id)
                return stored if stored is not None else ob
        return new

    def complete(self, ob: ObligationRow, now: float, detail: dict[str, Any]) -> ObligationRow:
        return self._update(ob, now, state=COMPLETED, detail={**ob.detail, **detail})

    def abandon(self, ob: ObligationRow, now: float, reason: str) -> ObligationRow:
        return self._update(ob, now, state=ABANDONED, reason=reason)

    def fail_attempt(
        self, ob: ObligationRow, now: float, next_attempt_at: float, error: str
    ) -> ObligationRow:
        return self._update(
            ob,
            now,
            attempts=ob.attempts + 1,
            next_attempt_at=next_attempt_at,
            last_error=bound_error(error),
        )

    def cut_short(self, ob: ObligationRow, now: float, error: str) -> ObligationRow:
        """An attempt interrupted (not failed): due at once, saying why; the attempt count, and
        so the backoff, is not raised."""
        return self._update(ob, now, next_attempt_at=now, last_error=bound_error(error))

    def make_due(self, ob: ObligationRow, now: float) -> ObligationRow:
        """A step recorded before what it acts on was there (a gc eviction's reclaim, deferred
        until its directory is in the trash): due at once."""
        return self._update(ob, now, next_attempt_at=now)

    def set_detail(self, ob: ObligationRow, now: float, detail: dict[str, Any]) -> ObligationRow:
        return self._update(ob, now, detail={**ob.detail, **detail})

    def defer_later_steps(
        self,
        workspace_id: str,
        after_seq: int,
        until: float,
        *,
        kinds: Sequence[str] | None = None,
    ) -> None:
        """Later steps of a workspace cannot run before an earlier one: they are not due either
        (so the scheduler never spins on a step it cannot run). `kinds`: only those (a lane
        defers its own steps, never another lane's)."""
        marks = ",".join("?" * len(kinds)) if kinds else ""
        only = f" AND kind IN ({marks})" if kinds else ""
        with self.store.transaction():
            self.store.execute(
                "UPDATE cleanup_obligations SET next_attempt_at = ? WHERE workspace_id = ? "
                f"AND state = 'pending' AND seq > ? AND next_attempt_at < ?{only}",
                (until, workspace_id, after_seq, until, *(kinds or ())),
            )

    def release_later_steps(self, workspace_id: str, after_seq: int, now: float) -> int:
        """An earlier step finished: the later steps `defer_later_steps` held back for it are
        due now (else the lane that looked while it was owed waits out the backoff it set).
        Only never-attempted steps: a step's own failures keep their backoff. A step still
        held by another earlier step is simply deferred again at its lane's next look."""
        with self.store.transaction():
            cur = self.store.execute(
                "UPDATE cleanup_obligations SET next_attempt_at = ? WHERE workspace_id = ? "
                "AND state = 'pending' AND seq > ? AND attempts = 0 AND next_attempt_at > ?",
                (now, workspace_id, after_seq, now),
            )
        return cur.rowcount

    def release_blocked_siblings(self, teardown: ObligationRow, now: float) -> int:
        """A teardown finished: other workspaces' never-attempted steps on the same directory
        (deferred while it was owed: `blocking_teardown`) are due now. One still blocked by
        another sibling's teardown is deferred again at its lane's next look."""
        with self.store.transaction():
            cur = self.store.execute(
                "UPDATE cleanup_obligations SET next_attempt_at = ? WHERE path = ? AND dev IS ? "
                "AND ino IS ? AND workspace_id != ? AND state = 'pending' AND attempts = 0 "
                "AND kind != 'reclaim' AND next_attempt_at > ?",
                (now, teardown.path, teardown.dev, teardown.ino, teardown.workspace_id, now),
            )
        return cur.rowcount

    def defer(self, ids: Iterable[str], until: float) -> None:
        with self.store.transaction():
            for ob_id in ids:
                self.store.execute(
                    "UPDATE cleanup_obligations SET next_attempt_at = ? WHERE id = ? "
                    "AND state = 'pending' AND next_attempt_at < ?",
                    (until, ob_id, until),
                )

    def clamp_future(self, latest: float) -> int:
        """A wall clock that jumped back must not postpone retries beyond one capped delay."""
        with self.store.transaction():
            cur = self.store.execute(
                "UPDATE cleanup_obligations SET next_attempt_at = ? "
                "WHERE state = 'pending' AND next_attempt_at > ?",
                (latest, latest),
            )
        return cur.rowcount

    def shift_pending(self, delta: float) -> int:
        """Re-anchor every pending retry time after the wall clock stepped by `delta` seconds:
        a retry keeps the wait it had left (measured on the monotonic clock)."""
        with self.store.transaction():
            cur = self.store.execute(
                "UPDATE cleanup_obligations SET next_attempt_at = next_attempt_at + ? "
                "WHERE state = 'pending'",
                (delta,),
            )
        return cur.rowcount

    def purge_finished(self, completed_before: float, abandoned_before: float) -> int:
        """Forget finished rows after a while (cleanup.list shows the recent ones), bounded."""
        with self.store.transaction():
            cur = self.store.execute(
                "DELETE FROM cleanup_obligations WHERE id IN (SELECT id FROM cleanup_obligations "
                "WHERE ((state = 'completed' AND updated_at < ?) "
                "OR (state IN ('abandoned', 'failed') AND updated_at < ?)) "
                # A workspace's finished steps stay while any of its steps is pending: its
                # status and the sibling fences read them.
                "AND workspace_id NOT IN (SELECT workspace_id FROM cleanup_obligations "
                "WHERE state = 'pending') LIMIT 1000)",
                (completed_before, abandoned_before),
            )
        return cur.rowcount
