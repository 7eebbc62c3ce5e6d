"""The quiescence check's process side: who holds a checkout, and stopping the daemon's own.

Plugged into `LifecycleHooks` (xumd.lifecycle.hooks): structural mutations call `holders(ref)`
under their exclusive reservation and refuse `busy` naming them; `archive {stop: true}` calls
`stop(ref, deadline)` first.
"""

from __future__ import annotations

import anyio

from xumd.base import logs
from xumd.checkouts.marker import WorkspaceRef
from xumd.lifecycle.hooks import Holder, command_line
from xumd.processes import probes
from xumd.processes.leases import LeaseStore, holder_of
from xumd.processes.supervisor import Supervisor

log = logs.get("xumd.processes.quiescence")

PROBE_DEADLINE_S = 5.0  # pragma: no mutate (the daemon always passes processes.probe_deadline_s)


class Quiescence:
    def __init__(
        self,
        supervisor: Supervisor,
        leases: LeaseStore,
        *,
        probe_deadline_s: float = PROBE_DEADLINE_S,
    ) -> None:
        self.supervisor = supervisor
        self.leases = leases
        self.probe_deadline_s = probe_deadline_s

    async def holders(self, ref: WorkspaceRef) -> list[Holder]:
        """Live leases (the supervisor's processes, setup/teardown runs, external holders),
        unconfirmed stops, and unleased processes whose cwd or an open file is in the checkout."""
        self.supervisor.settle(ref.id)
        live, _reclaimed = self.leases.reclaim_dead(ref.id, skip=self.supervisor.owns)
        found: list[Holder] = []
        for lease in live:
            managed = self.supervisor.procs.get(lease.process_id or "")
            if managed is not None:
                pending = managed.state == "pending_stop"
                found.append(
                    Holder(
                        kind="pending_stop" if pending else managed.kind,
                        pid=managed.pid,
                        label=f"{managed.label} (stop unconfirmed)" if pending else managed.label,
                        since=managed.started_at,
                        process_id=managed.id,
                        command=command_line(managed.argv),
                    )
                )
            else:
                found.append(
                    Holder(
                        lease.kind,
                        lease.pid,
                        lease.label,
                        lease.created_at,
                        process_id=lease.process_id,
                    )
                )
        pids, pgids = holder_of(live)
        found.extend(await self._probe(ref, pids, pgids))
        return found

    async def _probe(self, ref: WorkspaceRef, pids: set[int], pgids: set[int]) -> list[Holder]:
        with anyio.move_on_after(self.probe_deadline_s):
            users = await anyio.to_thread.run_sync(
                lambda: probes.find_users(ref.path, exclude_pids=pids, exclude_pgids=pgids),
                abandon_on_cancel=True,
            )
            return [
                Holder("process", u.pid, u.name, u.since, command=command_line(u.argv))
                for u in users
            ]
        # Fail closed: an unfinished probe cannot prove that nobody uses the checkout.
        log.warning("quiescence.probe_timeout", workspace=ref.id)
        return [Holder("probe", None, f"process probe did not finish in {self.probe_deadline_s}s")]

    async def stop(self, ref: WorkspaceRef, deadline_s: float) -> tuple[list[str], list[Holder]]:
        """Stop the daemon's own processes in the workspace, bounded; return the ids of those
        stopped and what is left."""
        stopped, left = await self.supervisor.release_all(ref.id, deadline_s)
        return stopped, [
            Holder(
                "pending_stop" if m.state == "pending_stop" else m.kind,
                m.pid,
                m.label,
                m.started_at,
                process_id=m.id,
                command=command_line(m.argv),
            )
            for m in left
        ]
