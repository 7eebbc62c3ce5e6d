"""Setup progress as events, so a client can show it while `workspace.create` / `unarchive` wait:
`script.started` {workspace_id, project_id, name, phase, index, count, command} before each
command, and `script.printed` {..., index, lines} for its output, line by line.

The type names are not `workspace.*` on purpose: those wake the cleanup service, output must not.
What is streamed is bounded (line length, lines per run); the result and `workspace.get` keep the
output's head and diagnostic tail as before.
"""

from __future__ import annotations

from typing import Any

from xumd.checkouts.marker import WorkspaceRef
from xumd.events import EventBus
from xumd.lifecycle.scripts import Phase

MAX_LINE_CHARS = 500
MAX_LINES = 2000
"""Per run: a setup printing more is still run and kept (head + tail), not streamed further."""


class ScriptEvents:
    """A `scripts.ScriptProgress` that publishes on the event bus."""

    def __init__(self, events: EventBus, workspace: WorkspaceRef, phase: Phase) -> None:
        self.events = events
        self.base: dict[str, Any] = {
            "workspace_id": workspace.id,
            "project_id": workspace.project_id,
            "name": workspace.name,
            "phase": phase,
        }
        self._index = 0
        self._partial = b""
        self._sent = 0

    def started(self, index: int, count: int, command: str) -> None:
        self.finished()
        self._index = index
        self.events.publish(
            "script.started", **self.base, index=index, count=count, command=command[:1000]
        )

    def printed(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > MAX_LINE_CHARS * 4:  # a very long line: show what came so far
            lines.append(self._partial)
            self._partial = b""
        self._publish(lines)

    def finished(self) -> None:
        """Publish the last line of a command that did not end with a newline."""
        if self._partial:
            self._publish([self._partial])
            self._partial = b""

    def _publish(self, raw: list[bytes]) -> None:
        room = MAX_LINES - self._sent
        if not raw or room <= 0:
            return
        lines = [line.decode(errors="replace").rstrip("\r")[:MAX_LINE_CHARS] for line in raw]
        if len(lines) >= room:
            lines = [*lines[: room - 1], "[... more output; the result keeps its tail ...]"]
        self._sent += len(lines)
        self.events.publish("script.printed", **self.base, index=self._index, lines=lines)
