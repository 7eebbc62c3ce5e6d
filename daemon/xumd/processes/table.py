"""The supervisor's records: live processes and the newest exited ones, found by id or workspace."""

from __future__ import annotations

from xum_protocol.errors import ErrorKind

from xumd.errors import XumError
from xumd.lifecycle.ids import check_id
from xumd.processes.leases import Lease
from xumd.processes.managed import Managed
from xumd.processes.settings import SupervisorSettings

PROCESS_PREFIX = "proc_"


class ProcessTable:
    def __init__(self, settings: SupervisorSettings) -> None:
        self.settings = settings
        self.procs: dict[str, Managed] = {}

    def add(self, managed: Managed) -> None:
        self.procs[managed.id] = managed

    def get(self, process_id: str) -> Managed:
        check_id(process_id, PROCESS_PREFIX, "process")
        managed = self.procs.get(process_id)
        if managed is None:
            raise XumError(ErrorKind.NOT_FOUND, f"process {process_id!r} not found", id=process_id)
        return managed

    def select(self, workspace_id: str | None = None) -> list[Managed]:
        found = [m for m in self.procs.values() if workspace_id in (None, m.workspace_id)]
        return sorted(found, key=lambda m: (m.started_at, m.id))

    def live(self) -> list[Managed]:
        return [m for m in self.procs.values() if m.live_state]

    def owns(self, lease: Lease) -> bool:
        """The lease covers one of these records: the supervisor settles it, not a lease sweep."""
        return bool(lease.process_id and lease.process_id in self.procs)

    def prune(self) -> None:
        """Keep the newest exited processes only (their output and exit), so memory is bounded."""
        exited = [m for m in self.procs.values() if not m.live_state]
        for managed in sorted(exited, key=lambda m: m.exit["at"] if m.exit else 0)[
            : max(0, len(exited) - self.settings.keep_exited)
        ]:
            del self.procs[managed.id]
            if managed.io is not None:
                managed.io.remove()
