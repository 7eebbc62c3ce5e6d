"""Setup progress on a terminal, for `xum ws new` and `xum ws unarchive`.

While the main connection waits for the daemon's answer, a second connection subscribed to
`script.*` and `workspace.*` events prints the setup's output lines as they come, under a spinner
that names the step. Only on a TTY and without --json: pipes and scripts see exactly the final
output. A failure to subscribe (an older daemon, say) only means no progress is shown.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from xum_client.errors import XumClientError
from xum_client.sync import Client

if TYPE_CHECKING:
    from rich.live import Live

    from xum_client.commands._context import Ctx

Subject = dict[str, Any]
"""The workspace an event is about: {id, project_id, name, state?}."""

JOIN_S = 2.0


def _subject(data: dict[str, Any]) -> Subject:
    ws = data.get("workspace")
    if isinstance(ws, dict):
        return ws
    return {"id": data.get("workspace_id"), **data}


def by_name(project_id: str, name: str) -> Callable[[Subject], bool]:
    """For a create: the id is not known before the answer, the project and name are."""
    return lambda s: s.get("project_id") == project_id and s.get("name") == name


def by_id(workspace_id: str) -> Callable[[Subject], bool]:
    return lambda s: s.get("id") == workspace_id


class SetupDisplay:
    def __init__(self, obj: Ctx, match: Callable[[Subject], bool], what: str) -> None:
        self.obj = obj
        self.match = match
        self.what = what
        self.streamed = False
        """True once a line of setup output was shown (the summary need not repeat it)."""
        self._client: Client | None = None
        self._live: Live | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> SetupDisplay:
        from rich.live import Live
        from rich.spinner import Spinner

        try:
            self._client = self.obj.client(timeout=None, client_name="xum-cli-progress")
            self._client.call("events.subscribe", {"types": ["script.", "workspace."]})
        except (XumClientError, OSError):
            self._close_client()
            return self
        self._live = Live(Spinner("dots", self.what), transient=True, refresh_per_second=8)
        self._live.start()
        self._thread = threading.Thread(target=self._follow, name="xum-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._client is not None:
            # Unblocks the follower's read: it sees the end of the stream and returns.
            self._client.interrupt()
        if self._thread is not None:
            self._thread.join(JOIN_S)
        if self._live is not None:
            self._live.stop()
        self._close_client()

    def _close_client(self) -> None:
        if self._client is not None:
            with contextlib.suppress(OSError, ValueError):
                self._client.close()
            self._client = None

    def _follow(self) -> None:
        assert self._client is not None
        while True:
            try:
                message = self._client.next_notification()
            except (XumClientError, OSError, ValueError):
                return
            if message.get("method") == "event":
                event = message.get("params") or {}
                data = event.get("data") or {}
                if self.match(_subject(data)):
                    self._show(str(event.get("type")), data)

    def _show(self, kind: str, data: dict[str, Any]) -> None:
        from rich.spinner import Spinner
        from rich.text import Text

        assert self._live is not None
        if kind == "script.started":
            step = f"{data['phase']} {data['index']}/{data['count']}: {data['command']}"
            self._live.console.print(Text(f"$ {data['command']}", style="bold"))
            self._live.update(Spinner("dots", f"{self.what}: {step}"))
        elif kind == "script.printed":
            for line in data.get("lines", []):
                self._live.console.print(Text(line), highlight=False)
            self.streamed = True
        elif kind.startswith("workspace.") and data.get("workspace"):
            state = data["workspace"].get("state", "")
            setup = (data["workspace"].get("setup") or {}).get("status")
            note = "setup running" if setup == "running" else state
            self._live.update(Spinner("dots", f"{self.what}: {note}"))


@contextlib.contextmanager
def setup_progress(
    obj: Ctx, match: Callable[[Subject], bool], what: str
) -> Iterator[SetupDisplay | None]:
    """A SetupDisplay on a terminal without --json; else nothing."""
    if obj.as_json or not sys.stdout.isatty():
        yield None
        return
    with SetupDisplay(obj, match, what) as display:
        yield display
