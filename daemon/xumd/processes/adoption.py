"""Adoption at start-up: the processes a previous daemon spawned, found through their leases.

A live one becomes a record again (`adopted: true`), reported as a holder and stoppable. It is not
this daemon's child, so its exit status cannot be read: its end is noticed through a pidfd and
settled by the liveness probe (`settled_by: "unknown"`). When it runs on durable I/O (a kept
agent or MCP server), its output file is followed with the same offsets as before the restart
and its stdin FIFO is writable again. A durable process that ended while no daemon ran becomes an
exited record, so what it wrote can still be read until the record is pruned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from xumd.base import logs
from xumd.base.events import EventBus
from xumd.processes import durable
from xumd.processes.durable import DurableIO
from xumd.processes.leases import Lease, LeaseStore
from xumd.processes.managed import Managed
from xumd.processes.ring import OutputRing
from xumd.processes.state import ProcessTable, SupervisorSettings

log = logs.get("xumd.processes.adoption")


@dataclass(frozen=True, slots=True)
class AdoptionPlace:
    """What adoption works on: the supervisor's parts, handed in (no part imports the
    supervisor)."""

    table: ProcessTable
    leases: LeaseStore
    events: EventBus
    settings: SupervisorSettings
    io_dir: Path | None
    keep_processes: bool


def adopt(place: AdoptionPlace) -> list[Managed]:
    """At start-up: leases of processes a previous daemon spawned. Live ones are adopted
    (reported, stoppable, their durable output followed) and returned; dead ones, and dead
    external holders, are reclaimed. A durable process that ended while no daemon ran is kept as
    an exited record, so its output can still be read. Unclaimed output directories go."""
    adopted: list[Managed] = []
    for managed in _records(place):
        place.table.add(managed)
        if managed.live_state:
            adopted.append(managed)
        else:
            place.events.publish("process.exited", process=managed.info())
    if place.io_dir is not None:
        durable.sweep(place.io_dir, {m.id for m in place.table.procs.values() if m.io is not None})
    place.table.prune()
    return adopted


def _records(place: AdoptionPlace) -> list[Managed]:
    """Records for the previous daemon's processes: live ones (adopted) and durable ones that
    ended meanwhile (exited). Dead holders' leases are reclaimed on the way."""
    leases = [
        x for x in place.leases.rows() if x.process_id and x.process_id not in place.table.procs
    ]
    _live, reclaimed = place.leases.reclaim_dead()
    dead = {x.id for x in reclaimed}
    if reclaimed:
        log.info("lease.reclaimed_at_start", count=len(reclaimed))
    found: list[Managed] = []
    for lease in leases:
        io = _durable_io(place.io_dir, lease)
        if lease.id in dead:
            if io is not None and lease.pid is not None:
                found.append(_ended_meanwhile(place, lease, io))
            elif io is not None:
                io.remove()  # its child never ran (the daemon died before the gate)
            continue
        managed = _record(place, lease, io)
        managed.state = "pending_stop" if lease.detail.get("stop_requested") else "running"
        managed.confirm_lost = True  # not our child any more: only a probe can see it end
        managed.on_daemon_stop = (
            "keep" if managed.io is not None and place.keep_processes else "stop"
        )
        if managed.io is None:
            managed.ring.close()  # nothing of its output reaches this daemon
        found.append(managed)
        log.info(
            "process.adopted",
            process=managed.id,
            pid=managed.pid,
            kind=managed.kind,
            output=managed.output_source,
        )
    return found


def _durable_io(io_dir: Path | None, lease: Lease) -> DurableIO | None:
    if io_dir is None or lease.detail.get("io") != "file" or not lease.process_id:
        return None
    io = DurableIO.existing(io_dir, lease.process_id)
    if io is None:
        log.warning("process.io_missing", process=lease.process_id)
    return io


def _open_log(place: AdoptionPlace, managed: Managed) -> None:
    """Follow the durable output; a file that cannot be opened must not stop the start-up: the
    process is still adopted (a holder, stoppable), its output is then not captured."""
    if managed.io is None:
        return
    try:
        managed.ring = managed.io.open_log(
            head_limit=place.settings.head_bytes, tail_limit=place.settings.tail_bytes
        )
    except OSError as exc:
        log.warning("process.io_unreadable", process=managed.id, error=str(exc))
        managed.io = None


def _record(place: AdoptionPlace, lease: Lease, io: DurableIO | None) -> Managed:
    assert lease.process_id is not None
    detail = lease.detail
    managed = Managed(
        id=lease.process_id,
        workspace_id=lease.workspace_id,
        kind=lease.kind,
        argv=list(detail.get("argv") or []),
        label=lease.label,
        pty=bool(detail.get("pty")),
        lease_id=lease.id,
        pid=lease.pid,
        pgid=lease.pgid,
        start_time=lease.start_time,
        started_at=lease.created_at,
        checkout=Path(detail.get("checkout") or "/"),
        ring=OutputRing(place.settings.head_bytes, place.settings.tail_bytes),
        io=io,
        adopted=True,
    )
    _open_log(place, managed)
    return managed


def _ended_meanwhile(place: AdoptionPlace, lease: Lease, io: DurableIO) -> Managed:
    managed = _record(place, lease, io)
    managed.lease_id = None  # reclaimed
    managed.state = "exited"
    managed.exit = {"code": None, "signal": None, "settled_by": "unknown", "at": time.time()}
    managed.ring.close()
    managed.exited.set()
    log.info("process.ended_while_down", process=managed.id, pid=managed.pid)
    return managed
