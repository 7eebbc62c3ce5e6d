"""How a process's end becomes final: its exit recorded, its lease removed, listeners told.

An exit is settled by the exit status when the daemon can read it, or by a probe when nobody will
(an adopted process, a lost confirmation): gone when neither the pid with its start time nor its
group lives. A stop whose exit is not confirmed yet is `pending_stop`, durable in the lease, so a
restarted daemon still reports it until a probe settles it (design invariant 5: fail closed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from xum_protocol.errors import ErrorKind

from xumd.base import logs
from xumd.base.errors import XumError
from xumd.base.events import EventBus
from xumd.processes import probes
from xumd.processes.leases import LeaseStore
from xumd.processes.managed import Managed
from xumd.processes.state import ProcessTable

log = logs.get("xumd.processes.settlement")


class Settlement:
    def __init__(
        self,
        table: ProcessTable,
        leases: LeaseStore,
        events: EventBus,
        exit_listeners: Sequence[Callable[[Managed], None]],
    ) -> None:
        self.table = table
        self.leases = leases
        self.events = events
        self.exit_listeners = list(exit_listeners)
        self.unremoved: dict[str, str] = {}
        """Leases of exited processes whose removal failed (a full store): lease id -> reason.
        The supervisor's sweep retries them (`retry_lease_removals`)."""

    def finish(self, managed: Managed, code: int | None, sig: str | None, settled_by: str) -> None:
        if managed.state == "exited":
            return
        if managed.lease_id:
            try:
                self.leases.remove(managed.lease_id, reason=f"exited ({settled_by})")
            except XumError as exc:
                if exc.kind is not ErrorKind.DISK_FULL:
                    raise
                # The exit is still a fact: record it in memory. The supervisor's sweep removes
                # the lease once the store takes writes again (a restart reclaims it too).
                self.unremoved[managed.lease_id] = f"exited ({settled_by})"
                log.warning("process.lease_remove_failed", process=managed.id, error=exc.message)
        managed.state = "exited"
        managed.exit = {"code": code, "signal": sig, "settled_by": settled_by, "at": time.time()}
        if managed.stop_reason:
            managed.exit["stop_reason"] = managed.stop_reason
        if managed.leftovers:
            managed.exit["leftovers"] = managed.leftovers
        managed.ring.close()
        if managed.io is not None:
            managed.io.close_writer()
        managed.exited.set()
        log.info("process.exited", process=managed.id, code=code, signal=sig, settled_by=settled_by)
        self.events.publish("process.exited", process=managed.info())
        self.table.prune()
        for listener in self.exit_listeners:
            try:
                listener(managed)
            except Exception:
                log.exception("process.exit_listener_failed", process=managed.id)

    def retry_lease_removals(self) -> None:
        for lease_id, reason in list(self.unremoved.items()):
            self.leases.remove(lease_id, reason=reason)
            del self.unremoved[lease_id]

    def mark_pending(self, managed: Managed) -> None:
        """A stop whose exit is not confirmed yet. Durable (in the lease), so that a restarted
        daemon still reports it as `pending_stop` until a probe settles it."""
        managed.state = "pending_stop"
        if managed.lease_id:
            self.leases.update_detail(managed.lease_id, stop_requested=True)

    def settle(self, workspace_id: str | None = None) -> list[Managed]:
        """Settle, by probe, the processes whose exit nobody will confirm (adopted ones, lost
        confirmations): gone when neither the pid with its start time nor its group lives."""
        settled: list[Managed] = []
        for managed in self.table.select(workspace_id):
            if not managed.live_state or not managed.confirm_lost:
                continue
            if probes.holder_alive(managed.pid, managed.start_time, managed.pgid):
                continue
            self.finish(managed, None, None, "unknown" if managed.adopted else "probe")
            settled.append(managed)
        return settled
