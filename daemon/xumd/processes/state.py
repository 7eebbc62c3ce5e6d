"""What the supervisor's parts share: its tunables, its table of records, and its task group.

The supervisor (supervisor.py) builds one of each and hands them to its parts (starting,
watching, settlement, stopping, foreground); no part imports the supervisor.

Settings: one mutable object rather than copies in each part: the supervisor's attributes
delegate here, so a value changed after construction (tests shrink the output limits or the
number of exited records kept) reaches every part at once.

The task group, while the supervisor serves, is where watchers and detached stops run. Requests
can arrive a moment before the background services start, and after shutdown began; `TaskHost`
says which (`running`, `stopping`) and lets a spawn wait, bounded, for the group.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
from xum_protocol.errors import ErrorKind

from xumd.base.errors import XumError
from xumd.lifecycle.ids import check_id
from xumd.processes.leases import Lease
from xumd.processes.managed import Managed
from xumd.system.containment import Containment

PROCESS_PREFIX = "proc_"
SERVE_WAIT_S = 5.0


WorkspaceEnv = Callable[[str], tuple[dict[str, str], dict[str, str]]]
"""workspace id -> (the workspace's own variables, its XUM_* variables)."""


@dataclass
class SupervisorSettings:
    workspace_env: WorkspaceEnv
    """The workspace's own variables and its XUM_* variables (`xumd.lifecycle.wsenv`): every
    process gets them."""
    containment: Containment | None
    """Each process carries a marker naming its id, so its descendants are found again,
    double-forked ones and after a crash (None: a supervisor outside the daemon, tests)."""
    grace_s: float = 5.0
    """SIGTERM to SIGKILL, for a stop without its own grace."""
    probe_interval_s: float = 2.0
    """How often the settle loop probes unconfirmed exits and reclaims dead leases."""
    head_bytes: int = 32 * 1024
    tail_bytes: int = 224 * 1024
    keep_exited: int = 256
    """Exited records kept (their output and exit), newest first; memory stays bounded."""
    output_poll_s: float = 0.1
    """How often a durable output file is polled for growth."""


class ProcessTable:
    """The supervisor's records: live processes and the newest exited ones, by id or workspace."""

    def __init__(self, settings: SupervisorSettings) -> None:
        self.settings = settings
        self.procs: dict[str, Managed] = {}
        self.revision = 0
        """Moves whenever a record is added or pruned (with `Managed.revision`: the status
        summary's key)."""

    def add(self, managed: Managed) -> None:
        self.procs[managed.id] = managed
        self.revision += 1

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
            self.revision += 1
            if managed.io is not None:
                managed.io.remove()


class TaskHost:
    def __init__(self) -> None:
        self.group: anyio.abc.TaskGroup | None = None
        self.stopping = False
        self._serving = anyio.Event()

    def attach(self, group: anyio.abc.TaskGroup) -> None:
        self.group = group
        self._serving.set()

    def detach(self) -> None:
        self.group = None

    @property
    def running(self) -> bool:
        return self.group is not None and not self.stopping

    async def wait_running(self) -> bool:
        """Wait (bounded) for the group if it is not there yet; False if it is not running."""
        if self.group is None and not self.stopping:
            with anyio.move_on_after(SERVE_WAIT_S):
                await self._serving.wait()
        return self.running

    def start_soon(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> bool:
        """Start `fn` in the group; False (nothing started) when the group is gone."""
        if self.group is None:
            return False
        self.group.start_soon(fn, *args)
        return True
