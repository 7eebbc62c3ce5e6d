"""One supervised process as the supervisor knows it."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import anyio

from xumd.processes.durable import DurableIO
from xumd.processes.output_log import OutputLog
from xumd.processes.ring import OutputRing
from xumd.processes.spawn import Child

_SUMMARISED = frozenset({"state", "on_daemon_stop"})
"""What the daemon.status summary of processes counts by (feature.py)."""

DEFAULT_LABELS = {"agent": "agent", "terminal": "terminal", "mcp": "MCP server"}


def default_label(kind: str, argv: list[str]) -> str:
    return DEFAULT_LABELS.get(kind) or (os.path.basename(argv[0]) if argv else kind)


def describe_status(returncode: int) -> tuple[int | None, str | None]:
    """(exit code, signal name) from a Popen returncode (negative: killed by that signal)."""
    if returncode < 0:
        try:
            return None, signal.Signals(-returncode).name
        except ValueError:
            return None, f"SIG{-returncode}"
    return returncode, None


@dataclass
class Managed:
    id: str
    workspace_id: str
    kind: str
    argv: list[str]
    label: str
    pty: bool
    lease_id: str | None
    pid: int | None
    pgid: int | None
    start_time: float | None
    started_at: float
    checkout: Path
    child: Child | None = None
    ring: OutputRing | OutputLog = field(default_factory=OutputRing)
    io: DurableIO | None = None
    """Durable output file and stdin FIFO (a process that may outlive the daemon), or None:
    pipes or a PTY to this daemon."""
    on_daemon_stop: str = "stop"
    """`keep`: left running when the daemon stops, adopted at the next start; `stop`: stopped."""
    stop_reason: str | None = None
    """Why the daemon stopped it: request, session, release, shutdown (None: not stopped)."""
    leftovers: list[dict[str, Any]] = field(default_factory=list)
    """What it left behind when it exited, stopped then (containment.Stopped.describe)."""
    foreground_peer: int | None = None
    adopted: bool = False
    state: str = "running"  # running | stopping | pending_stop | exited
    exit: dict[str, Any] | None = None
    exited: anyio.Event = field(default_factory=anyio.Event)
    confirm_lost: bool = False
    """The watcher will not confirm the exit (reading it failed): a probe must settle it."""

    revision: ClassVar[int] = 0
    """Moves whenever any record's `state` or `on_daemon_stop` is set (creation included): the
    processes' daemon.status summary is computed again only then (or when the table changed)."""

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name in _SUMMARISED:
            Managed.revision += 1

    @property
    def live_state(self) -> bool:
        return self.state != "exited"

    def info(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "workspace_id": self.workspace_id,
            "kind": self.kind,
            "argv": self.argv,
            "label": self.label,
            "pid": self.pid,
            "pgid": self.pgid,
            "started_at": self.started_at,
            "state": self.state,
            "pty": self.pty,
            "foreground": self.foreground_peer is not None,
            "adopted": self.adopted,
            "lease_id": self.lease_id,
            "exit": self.exit,
            "on_daemon_stop": self.on_daemon_stop,
        }

    @property
    def output_source(self) -> str:
        """`file`: durable, offsets survive restarts; `memory`: this daemon's ring; `none`:
        adopted without a durable file, nothing is captured."""
        if self.io is not None:
            return "file"
        return "none" if self.adopted else "memory"
