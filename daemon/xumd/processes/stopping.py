"""Stopping supervised processes: one, many at once under a deadline, a workspace's, all at
shutdown.

A stop is SIGTERM to the group, SIGKILL of the whole tree after the grace, then confirmation by
the exit status or, when that never comes, by a probe. Every stop is bounded; a process whose exit
is unconfirmed stays a holder (`pending_stop`) of its workspace only (design invariants 3 and 5).
At shutdown, kept processes (`on_daemon_stop: keep`) are left running for the next daemon.
"""

from __future__ import annotations

import anyio

from xumd.base import logs
from xumd.base.events import EventBus
from xumd.processes.managed import Managed
from xumd.processes.settlement import Settlement
from xumd.processes.state import ProcessTable, SupervisorSettings
from xumd.processes.watching import stop_marked_leftovers
from xumd.system.procutil import kill_tree

log = logs.get("xumd.processes.stopping")

CONFIRM_S = 2.0
"""How long an exit is awaited after the SIGKILL before the probe has to settle it."""


class Stopper:
    def __init__(
        self,
        table: ProcessTable,
        settlement: Settlement,
        events: EventBus,
        settings: SupervisorSettings,
    ) -> None:
        self.table = table
        self.settlement = settlement
        self.events = events
        self.settings = settings

    async def stop(
        self, managed: Managed, grace_s: float | None = None, reason: str = "request"
    ) -> Managed:
        """SIGTERM to the group, SIGKILL to the whole tree after the grace, then confirm.
        `reason` (request, session, release, shutdown) goes into the exit as `stop_reason`."""
        if not managed.live_state:
            return managed
        grace = self.settings.grace_s if grace_s is None else grace_s
        managed.stop_reason = managed.stop_reason or reason
        if managed.state == "running":
            managed.state = "stopping"
            self.events.publish("process.stopping", process=managed.info())
        if managed.pid:
            # Not shielded: a caller's deadline (release_all, shutdown) bounds the whole stop;
            # a stop cut short leaves the process reported as still running, never waited on.
            await kill_tree(managed.pid, managed.pgid, grace)
            await stop_marked_leftovers(self.settings, managed)
        with anyio.move_on_after(CONFIRM_S):
            await managed.exited.wait()
        if managed.live_state:
            self.settlement.settle(managed.workspace_id)
        if managed.live_state:
            self.settlement.mark_pending(managed)
            log.warning("process.stop_unconfirmed", process=managed.id, pid=managed.pid)
        return managed

    async def stop_many(
        self, targets: list[Managed], deadline_s: float, reason: str = "release"
    ) -> list[Managed]:
        """Stop these concurrently within the deadline; returns those still not exited."""
        # Leave room after the grace for the SIGKILL (bounded at 2s) and the confirmation.
        grace = min(self.settings.grace_s, max(deadline_s - CONFIRM_S - 2.5, deadline_s / 4))
        with anyio.move_on_after(deadline_s):
            async with anyio.create_task_group() as tg:
                for managed in targets:
                    tg.start_soon(self.stop, managed, grace, reason)
        left = [m for m in targets if m.live_state]
        for managed in left:
            # Cut short by the deadline: an unconfirmed stop, reported, blocking cleanup.
            self.settlement.mark_pending(managed)
        return left

    async def release_all(
        self, workspace_id: str, deadline_s: float
    ) -> tuple[list[str], list[Managed]]:
        targets = [m for m in self.table.select(workspace_id) if m.live_state]
        left = await self.stop_many(targets, deadline_s)
        return [m.id for m in targets if not m.live_state], left

    async def shutdown(self, deadline_s: float) -> list[Managed]:
        """Stop every process, bounded, except those kept (`on_daemon_stop: keep`), which are
        left running for the next daemon to adopt. Returns what is still running unkept."""
        live = self.table.live()
        targets = [m for m in live if m.on_daemon_stop != "keep"]
        left = await self.stop_many(targets, deadline_s, "shutdown")
        for managed in live:
            if managed.on_daemon_stop == "keep":
                if managed.io is not None:
                    managed.io.close_writer()
                log.info("process.kept", process=managed.id, pid=managed.pid, kind=managed.kind)
                self.events.publish("process.kept", process=managed.info())
        # Exited records live in this daemon's memory only: their output files go with them.
        for managed in self.table.procs.values():
            if managed.io is not None and not managed.live_state:
                managed.io.remove()
        return left
