"""The supervisor's tunables, shared by its parts (spawning, watching, stopping, the table).

One mutable object rather than copies in each part: the supervisor's attributes delegate here, so
a value changed after construction (tests shrink the output limits or the number of exited
records kept) reaches every part at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class SupervisorSettings:
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
    workspace_env: Any = None
    """Callable(workspace_id) -> (the workspace's own variables, its XUM_* variables)
    (xumd.lifecycle.wsenv.for_workspace, set by the processes feature): every process gets them."""
    containment: Any = None
    """xumd.containment.Containment (set when the daemon wires it): each process carries a marker
    naming its id, so its descendants are found again, double-forked ones and after a crash."""
