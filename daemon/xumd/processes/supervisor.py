"""The process supervisor: spawn, watch, talk to, stop and adopt supervised processes.

A facade over parts with one responsibility each:
- starting.py: admission, the lease before the program runs, the gated start;
- watching.py and settlement.py: output while it runs, its end, `pending_stop` and the probe;
- process_io.py: output, input, terminal size, signals, waiting for the exit;
- stopping.py and foreground.py: bounded stops, release, shutdown; a caller's foreground processes;
- adoption.py and outliving.py: processes that outlive the daemon (`keep_processes`) and their
  adoption by the next one (docs/PROCESSES.md has the whole design).

Rules it keeps (design invariants 3 and 5):
- a spawn writes the lease (durable) before the program runs, in the workspace's shared
  reservation, so it can only start in an active workspace;
- every wait is bounded; a stop is SIGTERM to the group, then SIGKILL of the whole tree after the
  grace, then confirmation by the exit status or, when that never comes, by a probe;
- a process whose exit is unconfirmed stays a holder (`pending_stop`) of its workspace only.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from xum_protocol.errors import ErrorKind

from xumd.base import logs
from xumd.base.errors import XumError
from xumd.base.events import EventBus
from xumd.processes import adoption, process_io
from xumd.processes.foreground import Foreground
from xumd.processes.leases import Lease, LeaseStore
from xumd.processes.managed import Managed
from xumd.processes.outliving import KEEPABLE_KINDS, KeepPolicy
from xumd.processes.process_io import parse_signal
from xumd.processes.settlement import Settlement
from xumd.processes.starting import Admit, Starter, child_env
from xumd.processes.state import (
    PROCESS_PREFIX,
    ProcessTable,
    SupervisorSettings,
    TaskHost,
    WorkspaceEnv,
)
from xumd.processes.stopping import CONFIRM_S, Stopper
from xumd.processes.watching import Watcher
from xumd.system.containment import Containment
from xumd.system.fdlimits import is_exhausted

__all__ = [
    "CONFIRM_S",
    "KEEPABLE_KINDS",
    "PROCESS_PREFIX",
    "Admit",
    "Supervisor",
    "child_env",
    "parse_signal",
]

log = logs.get("xumd.processes.supervisor")


class Supervisor:
    def __init__(
        self,
        leases: LeaseStore,
        events: EventBus,
        admit: Admit,
        *,
        grace_s: float = 5.0,
        probe_interval_s: float = 2.0,
        head_bytes: int = 32 * 1024,
        tail_bytes: int = 224 * 1024,
        keep_exited: int = 256,
        io_dir: Path | None = None,
        keep_processes: bool = False,
        output_poll_s: float = 0.1,
        workspace_env: WorkspaceEnv,
        containment: Containment | None,
        exit_listeners: Sequence[Callable[[Managed], None]],
    ) -> None:
        """The collaborators have no default: the composition root hands in the lifecycle's
        workspace variables, the daemon's containment (None, a supervisor outside the daemon:
        tests, starts processes without a marker, by the caller's explicit choice) and what is
        told of each exit (auto-archive)."""
        self.leases = leases
        self.events = events
        self.admit = admit
        self.io_dir = io_dir
        self.settings = SupervisorSettings(
            grace_s=grace_s,
            probe_interval_s=probe_interval_s,
            head_bytes=head_bytes,
            tail_bytes=tail_bytes,
            keep_exited=keep_exited,
            output_poll_s=output_poll_s,
            workspace_env=workspace_env,
            containment=containment,
        )
        self.keep = KeepPolicy(io_dir, keep_processes)
        self.table = ProcessTable(self.settings)
        self.tasks = TaskHost()
        self.settlement = Settlement(self.table, leases, events, exit_listeners)
        self.watcher = Watcher(self.settlement, self.settings)
        self.starter = Starter(
            table=self.table,
            leases=leases,
            events=events,
            admit=admit,
            settings=self.settings,
            keep=self.keep,
            tasks=self.tasks,
            watcher=self.watcher,
        )
        self.stopper = Stopper(self.table, self.settlement, events, self.settings)
        self.foreground = Foreground(
            table=self.table,
            settlement=self.settlement,
            stopper=self.stopper,
            events=events,
            admit=admit,
            settings=self.settings,
            tasks=self.tasks,
        )
        # The part's own method, not a wrapper restating its long signature.
        self.spawn = self.starter.spawn

    # -- state other features and tests read (and tests tune) ---------------------------------

    @property
    def procs(self) -> dict[str, Managed]:
        return self.table.procs

    @property
    def exit_listeners(self) -> list[Callable[[Managed], None]]:
        return self.settlement.exit_listeners

    @property
    def stopping(self) -> bool:
        return self.tasks.stopping

    @property
    def keep_processes(self) -> bool:
        return self.keep.enabled

    @property
    def keep_problem(self) -> str | None:
        """Why keep_processes is not in effect although asked for (None: it is, or not asked)."""
        return self.keep.problem

    @property
    def grace_s(self) -> float:
        return self.settings.grace_s

    @property
    def head_bytes(self) -> int:
        return self.settings.head_bytes

    @head_bytes.setter
    def head_bytes(self, value: int) -> None:
        self.settings.head_bytes = value

    @property
    def tail_bytes(self) -> int:
        return self.settings.tail_bytes

    @tail_bytes.setter
    def tail_bytes(self, value: int) -> None:
        self.settings.tail_bytes = value

    @property
    def keep_exited(self) -> int:
        return self.settings.keep_exited

    @keep_exited.setter
    def keep_exited(self, value: int) -> None:
        self.settings.keep_exited = value

    # -- life of the supervisor --------------------------------------------------------------

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Own the watchers' task group and run the settle loop until cancelled."""
        async with anyio.create_task_group() as tg:
            self.tasks.attach(tg)
            for managed in self.table.live():
                if managed.child is not None:
                    tg.start_soon(self.watcher.watch, managed)
                elif managed.adopted:
                    tg.start_soon(self.watcher.watch_adopted, managed)
            task_status.started()
            try:
                while True:
                    await anyio.sleep(self.settings.probe_interval_s)
                    try:
                        self.settlement.retry_lease_removals()
                        self.settle()
                        self.leases.reclaim_dead(skip=self.owns)
                    except XumError as exc:
                        # A full store must not stop the supervisor: the next round retries.
                        if exc.kind is not ErrorKind.DISK_FULL:
                            raise
                        log.warning("processes.sweep_failed", error=exc.message)
                    except OSError as exc:
                        if not is_exhausted(exc):
                            raise
                        # Out of descriptors, a probe cannot look: nothing is settled or
                        # reclaimed (fail closed) and the loop lives to probe again.
                        log.warning("process.probe_skipped", error=exc.strerror)
            finally:
                self.tasks.detach()

    def owns(self, lease: Lease) -> bool:
        """The lease covers one of this supervisor's records (a lease sweep must skip it)."""
        return self.table.owns(lease)

    def keepable(self, kind: str, pty: bool, foreground: bool) -> bool:
        return self.keep.keepable(kind, pty, foreground)

    def adopt(self) -> list[Managed]:
        """At start-up: adopt the live processes a previous daemon spawned (adoption.py)."""
        return adoption.adopt(
            adoption.AdoptionPlace(
                table=self.table,
                leases=self.leases,
                events=self.events,
                settings=self.settings,
                io_dir=self.io_dir,
                keep_processes=self.keep_processes,
            )
        )

    # -- lookup, settle (spawn: starting.py) --------------------------------------------------

    def get(self, process_id: str) -> Managed:
        return self.table.get(process_id)

    def select(self, workspace_id: str | None = None) -> list[Managed]:
        return self.table.select(workspace_id)

    def settle(self, workspace_id: str | None = None) -> list[Managed]:
        return self.settlement.settle(workspace_id)

    # -- talking to it -----------------------------------------------------------------------

    async def output(
        self, managed: Managed, since: int, wait_s: float, max_bytes: int, encoding: str
    ) -> dict[str, Any]:
        return await process_io.read_output(managed, since, wait_s, max_bytes, encoding)

    async def write(self, managed: Managed, data: bytes, eof: bool) -> int:
        return await process_io.write_input(managed, data, eof)

    def resize(self, managed: Managed, cols: int, rows: int) -> None:
        process_io.resize(managed, cols, rows)

    def signal(self, managed: Managed, sig: signal.Signals) -> None:
        process_io.send_signal(managed, sig)

    async def wait(self, managed: Managed, timeout_s: float) -> Managed:
        return await process_io.wait_exited(managed, timeout_s)

    # -- stopping, foreground and background, shutdown -----------------------------------------

    async def stop(
        self, managed: Managed, grace_s: float | None = None, reason: str = "request"
    ) -> Managed:
        return await self.stopper.stop(managed, grace_s, reason)

    async def stop_many(
        self, targets: list[Managed], deadline_s: float, reason: str = "release"
    ) -> list[Managed]:
        return await self.stopper.stop_many(targets, deadline_s, reason)

    async def release_all(
        self, workspace_id: str, deadline_s: float
    ) -> tuple[list[str], list[Managed]]:
        return await self.stopper.release_all(workspace_id, deadline_s)

    def watch_peer(self, peer: Any) -> None:
        self.foreground.watch_peer(peer)

    async def background(self, managed: Managed) -> Managed:
        return await self.foreground.background(managed)

    async def shutdown(self, deadline_s: float) -> list[Managed]:
        """Stop every process, bounded, except the kept ones; no spawn is accepted meanwhile."""
        self.tasks.stopping = True
        return await self.stopper.shutdown(deadline_s)
