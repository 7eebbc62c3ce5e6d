"""Which processes may outlive the daemon (`keep_processes`; docs/PROCESSES.md).

Agents and MCP servers without a PTY are *keepable*: they run on durable I/O (durable.py) so the
daemon can stop without the child getting SIGPIPE/EPIPE or EOF. Terminals and PTYs are not (the
daemon holds the PTY master, and closing it hangs up the session), nor are commands (exec: their
exit status is the point, and an adopting daemon is not the parent that can read it; a foreground
one is bound to its caller's connection, which ends with the daemon).
"""

from __future__ import annotations

from pathlib import Path

from xumd.base import logs
from xumd.processes.output_log import hole_punching_problem

log = logs.get("xumd.processes.outliving")

KEEPABLE_KINDS = frozenset({"agent", "mcp"})
"""Kinds that may outlive the daemon (keep_processes), when they run without a PTY."""


class KeepPolicy:
    def __init__(self, io_dir: Path | None, asked: bool) -> None:
        self.io_dir = io_dir
        self.problem: str | None = None
        """Why keep_processes is not in effect although asked for (None: it is, or not asked)."""
        if asked:
            # Durable output must stay bounded, which needs hole punching in its directory.
            self.problem = (
                "no directory for durable output"
                if io_dir is None
                else hole_punching_problem(io_dir)
            )
            if self.problem:
                log.warning("processes.keep_unavailable", reason=self.problem)
        self.enabled = asked and self.problem is None

    def keepable(self, kind: str, pty: bool, foreground: bool) -> bool:
        return self.enabled and kind in KEEPABLE_KINDS and not pty and not foreground
