"""Seams between the lifecycle coordinator and the services that plug into it.

The lifecycle service owns structural mutations. Other services plug in here, so that no module
imports a sibling's internals:
- holder probes (processes and leases) say who uses a checkout, for `busy` refusals;
- stoppers stop the daemon's own processes in a workspace (archive with `stop: true`, shutdown);
- cleanup performs physical steps as durable obligations (see xumd.cleanup);
- recovery settles a kept rename journal on `workspace.keep` (the rename settler).
`LifecycleHooks` is provided by the composition root before any feature installs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class WorkspaceRef:
    id: str
    project_id: str
    name: str
    path: Path
    incarnation: str


@dataclass(frozen=True, slots=True)
class Holder:
    """Someone using a checkout: `kind` is e.g. terminal, agent, mcp, exec, editor, setup,
    teardown, process (found by the cwd/open-file probe), pending_stop."""

    kind: str
    pid: int | None
    label: str
    since: float | None = None

    def describe(self) -> str:
        return f"{self.label or self.kind} in pid {self.pid}" if self.pid else self.label

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "pid": self.pid, "label": self.label, "since": self.since}


HolderProbe = Callable[[WorkspaceRef], Awaitable[list[Holder]]]
Stopper = Callable[[WorkspaceRef, float], Awaitable[tuple[list[str], list[Holder]]]]
"""Stop the daemon's own processes in the workspace within the deadline; return the ids of the
processes it stopped and what is left."""
RenameSettler = Callable[[str], Awaitable[str | None]]
"""Settle a workspace's kept rename journal by what the disk shows (recovery's startup logic for
one row; the caller holds the exclusive reservation). Returns the problem the row stays flagged
with (None: settled cleanly); raises `invalid_state`, changing nothing, when the disk proves
neither state."""


@dataclass
class LifecycleHooks:
    holder_probes: list[HolderProbe] = field(default_factory=list)
    stoppers: list[Stopper] = field(default_factory=list)
    rename_settler: RenameSettler | None = None

    async def holders(self, workspace: WorkspaceRef) -> list[Holder]:
        found: list[Holder] = []
        for probe in self.holder_probes:
            found.extend(await probe(workspace))
        return found

    async def stop_all(
        self, workspace: WorkspaceRef, deadline_s: float
    ) -> tuple[list[str], list[Holder]]:
        """The ids of the processes stopped, and the holders left."""
        stopped: list[str] = []
        left: list[Holder] = []
        for stop in self.stoppers:
            done, remaining = await stop(workspace, deadline_s)
            stopped.extend(done)
            left.extend(remaining)
        return stopped, left


def busy_message(holders: list[Holder]) -> str:
    return "busy: " + ", ".join(h.describe() for h in holders)
