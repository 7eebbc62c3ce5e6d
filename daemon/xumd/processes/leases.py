"""Durable use leases: one row per (holder, workspace, kind), written before the effect it covers.

A lease says "this checkout is in use by that holder". It is written before the effect (a lease
whose child does not exist yet has no pid and is live only while the daemon that wrote it is), it
gets the holder's pid, pgid and start time once they exist, and it is removed when the effect ends.
A lease whose holder died is reclaimed by whoever looks at it (no call needed): see
`xumd.processes.probes.holder_alive` for the rule.

Setup/teardown runs (the lifecycle's ScriptRunner) use `LeaseStore.covering`:

    async with leases.covering(ref.id, "setup", label="setup script") as lease:
        result = await run_command(argv, ..., on_start=lease.on_start)
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from xumd.base import logs
from xumd.base.events import EventBus
from xumd.processes import probes
from xumd.store import Store
from xumd.system.procstat import start_time

log = logs.get("xumd.processes.leases")

LEASE_PREFIX = "lease_"


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(8)


@dataclass(frozen=True, slots=True)
class Lease:
    id: str
    workspace_id: str
    kind: str
    holder: str
    pid: int | None
    pgid: int | None
    start_time: float | None
    owner_pid: int
    owner_start: float | None
    label: str
    process_id: str | None
    detail: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0

    def as_info(self, live: bool) -> dict[str, Any]:
        return {
            "id": self.id,
            "workspace_id": self.workspace_id,
            "kind": self.kind,
            "holder": self.holder,
            "pid": self.pid,
            "pgid": self.pgid,
            "start_time": self.start_time,
            "label": self.label,
            "process_id": self.process_id,
            "live": live,
            "created_at": self.created_at,
        }


def _lease(row: Any) -> Lease:
    return Lease(
        id=row["id"],
        workspace_id=row["workspace_id"],
        kind=row["kind"],
        holder=row["holder"],
        pid=row["pid"],
        pgid=row["pgid"],
        start_time=row["start_time"],
        owner_pid=row["owner_pid"],
        owner_start=row["owner_start"],
        label=row["label"],
        process_id=row["process_id"],
        detail=json.loads(row["detail"] or "{}"),
        created_at=row["created_at"],
    )


@dataclass
class ScriptLease:
    """The lease of one setup/teardown run: `on_start(pid)` records the child once it exists."""

    store: LeaseStore
    lease: Lease

    def on_start(self, pid: int) -> None:
        # run_command starts every child in a new session: it leads its own group.
        self.store.record_pid(self.lease.id, pid, pid, start_time(pid))


class LeaseStore:
    def __init__(self, store: Store, events: EventBus) -> None:
        self.store = store
        self.events = events
        self.owner_pid = os.getpid()
        self.owner_start = start_time(self.owner_pid)

    # -- writes ----------------------------------------------------------------------------------

    def write_intent(
        self,
        *,
        workspace_id: str,
        kind: str,
        holder: str,
        label: str,
        process_id: str | None = None,
        detail: dict[str, Any] | None = None,
        pid: int | None = None,
        pgid: int | None = None,
        start: float | None = None,
    ) -> Lease:
        """Insert a lease (before the effect). The caller holds the workspace's reservation."""
        lease_id = new_id(LEASE_PREFIX)
        now = time.time()
        with self.store.transaction() as db:
            db.execute(
                "INSERT INTO leases (id, workspace_id, kind, holder, pid, pgid, start_time, "
                "owner_pid, owner_start, label, process_id, detail, created_at) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    lease_id,
                    workspace_id,
                    kind,
                    holder,
                    pid,
                    pgid,
                    start,
                    self.owner_pid,
                    self.owner_start,
                    label,
                    process_id,
                    json.dumps(detail or {}),
                    now,
                ),
            )
        lease = self.get(lease_id)
        assert lease is not None
        log.info("lease.written", lease=lease_id, workspace=workspace_id, kind=kind, pid=pid)
        return lease

    def record_pid(self, lease_id: str, pid: int, pgid: int | None, start: float | None) -> None:
        with self.store.transaction() as db:
            db.execute(
                "UPDATE leases SET pid = ?, pgid = ?, start_time = ? WHERE id = ?",
                (pid, pgid, start, lease_id),
            )
        lease = self.get(lease_id)
        if lease is not None:
            self._publish("lease.acquired", lease, True)

    def update_detail(self, lease_id: str, **changes: Any) -> None:
        with self.store.transaction() as db:
            row = db.execute("SELECT detail FROM leases WHERE id = ?", (lease_id,)).fetchone()
            if row is None:
                return
            detail = {**json.loads(row["detail"] or "{}"), **changes}
            db.execute("UPDATE leases SET detail = ? WHERE id = ?", (json.dumps(detail), lease_id))

    def acquire_external(
        self, *, workspace_id: str, kind: str, pid: int, label: str
    ) -> tuple[Lease, bool]:
        """An external holder registers itself by pid. Raises LookupError if pid is no process.

        Its group is recorded only when it leads it: a process inside someone else's group (a
        shell's job) must not extend its lease to unrelated members.
        """
        started = start_time(pid)
        if started is None or not probes.holder_alive(pid, started, None):
            raise LookupError(f"pid {pid} is not a running process")
        try:
            pgid: int | None = os.getpgid(pid)
        except OSError:
            pgid = None
        if pgid != pid:
            pgid = None
        holder = f"pid:{pid}:{started:.3f}"
        existing = self.store.one(
            "SELECT * FROM leases WHERE holder = ? AND workspace_id = ? AND kind = ?",
            (holder, workspace_id, kind),
        )
        if existing is not None:
            return _lease(existing), False
        lease = self.write_intent(
            workspace_id=workspace_id,
            kind=kind,
            holder=holder,
            label=label or kind,
            pid=pid,
            pgid=pgid,
            start=started,
        )
        self._publish("lease.acquired", lease, True)
        return lease, True

    def remove(self, lease_id: str, *, reason: str = "released") -> bool:
        lease = self.get(lease_id)
        with self.store.transaction() as db:
            gone = db.execute("DELETE FROM leases WHERE id = ?", (lease_id,)).rowcount > 0
            if gone and lease is not None:
                # Held until now: what the disk budget's idleness reads (`last_held`).
                with contextlib.suppress(sqlite3.IntegrityError):
                    # (its workspace's row is gone: a removed workspace's teardown ending)
                    db.execute(
                        "INSERT INTO workspace_activity (workspace_id, held_at) VALUES (?, ?) "
                        "ON CONFLICT (workspace_id) DO UPDATE SET held_at = excluded.held_at",
                        (lease.workspace_id, time.time()),
                    )
        if gone and lease is not None:
            log.info("lease.removed", lease=lease_id, reason=reason, pid=lease.pid)
            self._publish("lease.released", lease, False, reason=reason)
        return gone

    @asynccontextmanager
    async def covering(
        self, workspace_id: str, kind: str, *, label: str = ""
    ) -> AsyncIterator[ScriptLease]:
        """A lease around one run (setup, teardown): written at entry, removed at exit."""
        lease = self.write_intent(
            workspace_id=workspace_id,
            kind=kind,
            holder=new_id("run:"),
            label=label or kind,
        )
        try:
            yield ScriptLease(self, lease)
        finally:
            self.remove(lease.id, reason="ended")

    # -- reads -----------------------------------------------------------------------------------

    def get(self, lease_id: str) -> Lease | None:
        row = self.store.one("SELECT * FROM leases WHERE id = ?", (lease_id,))
        return _lease(row) if row is not None else None

    def for_process(self, process_id: str) -> Lease | None:
        row = self.store.one("SELECT * FROM leases WHERE process_id = ?", (process_id,))
        return _lease(row) if row is not None else None

    def rows(self, workspace_id: str | None = None) -> list[Lease]:
        if workspace_id is None:
            found = self.store.all("SELECT * FROM leases ORDER BY created_at, id")
        else:
            found = self.store.all(
                "SELECT * FROM leases WHERE workspace_id = ? ORDER BY created_at, id",
                (workspace_id,),
            )
        return [_lease(r) for r in found]

    def is_live(self, lease: Lease) -> bool:
        if lease.pid is None:
            # Written before its child exists: live while the daemon that wrote it is.
            if lease.owner_pid == self.owner_pid:
                return True
            return probes.owner_alive(lease.owner_pid, lease.owner_start)
        return probes.holder_alive(lease.pid, lease.start_time, lease.pgid)

    def reclaim_dead(
        self,
        workspace_id: str | None = None,
        *,
        skip: Callable[[Lease], bool] = lambda _: False,
    ) -> tuple[list[Lease], list[Lease]]:
        """(live, reclaimed): remove every dead holder's lease; `skip` ones are left as they are
        (the supervisor settles its own processes' leases itself) and listed as live."""
        live: list[Lease] = []
        reclaimed: list[Lease] = []
        for lease in self.rows(workspace_id):
            if skip(lease) or self.is_live(lease):
                live.append(lease)
                continue
            if self.remove(lease.id, reason="holder gone"):
                reclaimed.append(lease)
        return live, reclaimed

    def _publish(self, type_: str, lease: Lease, live: bool, **extra: Any) -> None:
        self.events.publish(type_, lease=lease.as_info(live), **extra)


def last_held(store: Store, workspace_id: str) -> float | None:
    """When the workspace's last lease went (wall time), or None: never recorded."""
    row = store.one(
        "SELECT held_at FROM workspace_activity WHERE workspace_id = ?", (workspace_id,)
    )
    return float(row["held_at"]) if row is not None else None


def holder_of(leases: Iterable[Lease]) -> tuple[set[int], set[int]]:
    """(pids, pgids) covered by leases: the cwd probe does not report them a second time."""
    pids = {lease.pid for lease in leases if lease.pid}
    pgids = {lease.pgid for lease in leases if lease.pgid}
    return pids, pgids
