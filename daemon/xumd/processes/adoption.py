"""Adoption at start-up: the processes a previous daemon spawned, found through their leases.

A live one becomes a record again (`adopted: true`), reported as a holder and stoppable. It is not
this daemon's child, so its exit status cannot be read: its end is noticed through a pidfd and
settled by the liveness probe (`settled_by: "unknown"`). When it runs on durable I/O (a kept
agent or MCP server), its output file is followed with the same offsets as before the restart
and its stdin FIFO is writable again. A durable process that ended while no daemon ran becomes an
exited record, so what it wrote can still be read until the record is pruned.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from xumd import logs
from xumd.processes import durable
from xumd.processes.durable import DurableIO
from xumd.processes.leases import Lease
from xumd.processes.managed import Managed
from xumd.processes.ring import OutputRing
from xumd.procutil import same_process_alive

if TYPE_CHECKING:
    from xumd.processes.supervisor import Supervisor

log = logs.get("xumd.processes.adoption")


def adopt(sup: Supervisor) -> list[Managed]:
    """At start-up: leases of processes a previous daemon spawned. Live ones are adopted
    (reported, stoppable, their durable output followed) and returned; dead ones, and dead
    external holders, are reclaimed. A durable process that ended while no daemon ran is kept as
    an exited record, so its output can still be read. Unclaimed output directories go."""
    adopted: list[Managed] = []
    for managed in _records(sup):
        sup.table.add(managed)
        if managed.live_state:
            adopted.append(managed)
        else:
            sup.events.publish("process.exited", process=managed.info())
    if sup.io_dir is not None:
        durable.sweep(sup.io_dir, {m.id for m in sup.procs.values() if m.io is not None})
    sup.table.prune()
    return adopted


def _records(sup: Supervisor) -> list[Managed]:
    """Records for the previous daemon's processes: live ones (adopted) and durable ones that
    ended meanwhile (exited). Dead holders' leases are reclaimed on the way."""
    leases = [x for x in sup.leases.rows() if x.process_id and x.process_id not in sup.procs]
    _live, reclaimed = sup.leases.reclaim_dead()
    dead = {x.id for x in reclaimed}
    if reclaimed:
        log.info("lease.reclaimed_at_start", count=len(reclaimed))
    found: list[Managed] = []
    for lease in leases:
        io = _durable_io(sup.io_dir, lease)
        if lease.id in dead:
            if io is not None and lease.pid is not None:
                found.append(_ended_meanwhile(sup, lease, io))
            elif io is not None:
                io.remove()  # its child never ran (the daemon died before the gate)
            continue
        managed = _record(sup, lease, io)
        managed.state = "pending_stop" if lease.detail.get("stop_requested") else "running"
        managed.confirm_lost = True  # not our child any more: only a probe can see it end
        managed.on_daemon_stop = "keep" if managed.io is not None and sup.keep_processes else "stop"
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


def _open_log(sup: Supervisor, managed: Managed) -> None:
    """Follow the durable output; a file that cannot be opened must not stop the start-up: the
    process is still adopted (a holder, stoppable), its output is then not captured."""
    if managed.io is None:
        return
    try:
        managed.ring = managed.io.open_log(head_limit=sup.head_bytes, tail_limit=sup.tail_bytes)
    except OSError as exc:
        log.warning("process.io_unreadable", process=managed.id, error=str(exc))
        managed.io = None


def _record(sup: Supervisor, lease: Lease, io: DurableIO | None) -> Managed:
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
        ring=OutputRing(sup.head_bytes, sup.tail_bytes),
        io=io,
        adopted=True,
    )
    _open_log(sup, managed)
    return managed


def _ended_meanwhile(sup: Supervisor, lease: Lease, io: DurableIO) -> Managed:
    managed = _record(sup, lease, io)
    managed.lease_id = None  # reclaimed
    managed.state = "exited"
    managed.exit = {"code": None, "signal": None, "settled_by": "unknown", "at": time.time()}
    managed.ring.close()
    managed.exited.set()
    log.info("process.ended_while_down", process=managed.id, pid=managed.pid)
    return managed


async def leader_gone(pid: int, start: float | None, *, recheck_s: float = 1.0) -> None:
    """Return once the process (pid *and* start time) has ended. A pidfd becomes readable when
    any process ends, not only a child; the start time is re-checked each second, which also
    covers a pid reused before the pidfd was opened, and systems without pidfd_open."""
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except (OSError, AttributeError):
        pidfd = None
    try:
        while same_process_alive(pid, start):
            if pidfd is None:
                await anyio.sleep(recheck_s)
                continue
            with anyio.move_on_after(recheck_s):
                await anyio.wait_readable(pidfd)
    finally:
        if pidfd is not None:
            with contextlib.suppress(Exception):
                anyio.notify_closing(pidfd)
            os.close(pidfd)
