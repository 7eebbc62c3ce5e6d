"""The MCP resources: the workspace list, and each workspace's status, read from the daemon when
asked (nothing is cached here); which of them a daemon event changes, and which of them an
agent listens to, for the change notifications (`server.py` sends them)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

LIST_URI = "xum://workspaces"
WORKSPACE_PREFIX = "xum://workspace/"
WORKSPACE_TEMPLATE = WORKSPACE_PREFIX + "{workspace_id}"
MIME = "application/json"

WATCHED = ["workspace."]
"""The daemon event types that change a resource (prefix match)."""

LIST_CHANGING = ("workspace.created", "workspace.removed", "workspace.renamed")
"""Events after which the resource list itself (which workspaces, their names) differs."""


def workspace_uri(workspace_id: str) -> str:
    return WORKSPACE_PREFIX + workspace_id


def workspace_id_of(uri: str) -> str | None:
    """The workspace a `xum://workspace/ID` URI names; None for any other URI."""
    if not uri.startswith(WORKSPACE_PREFIX):
        return None
    rest = uri[len(WORKSPACE_PREFIX) :]
    return rest if rest and "/" not in rest else None


def resource_entry(workspace: dict[str, Any]) -> dict[str, Any]:
    return {
        "uri": workspace_uri(str(workspace["id"])),
        "name": f"workspace {workspace.get('name')}",
        "description": f"State, setup, snapshot, last cleanup, ports and env of {workspace['id']} "
        f"({workspace.get('state')}).",
        "mime_type": MIME,
    }


@dataclass(frozen=True, slots=True)
class Change:
    """What one event changed: the URIs to say `updated` for, and whether the list of
    resources changed too."""

    uris: list[str] = field(default_factory=list)
    list_changed: bool = False


def change_of(event_type: str, data: dict[str, Any]) -> Change:
    if not event_type.startswith("workspace."):
        return Change()
    workspace = data.get("workspace")
    ws_id = workspace.get("id") if isinstance(workspace, dict) else data.get("workspace_id")
    uris = [LIST_URI]
    if isinstance(ws_id, str):
        uris.append(workspace_uri(ws_id))
    return Change(uris, event_type in LIST_CHANGING)


class Interest:
    """The resource URIs an agent listens to: the handshake session's `resources/subscribe`s,
    and each open 2026-07-28 `subscriptions/listen` stream's `resourceSubscriptions` (counted: two
    streams may name one URI). After missed events each of them is said to be updated."""

    def __init__(self) -> None:
        self.subscribed: set[str] = set()
        self._listened: Counter[str] = Counter()

    @contextmanager
    def listening(self, uris: Iterable[str]) -> Iterator[None]:
        """For as long as one listen stream is open."""
        held = set(uris)
        self._listened.update(held)
        try:
            yield
        finally:
            self._listened.subtract(held)
            self._listened = +self._listened  # the URIs no stream names any more go

    def uris(self) -> list[str]:
        return sorted(self.subscribed | set(self._listened))

    def everything(self) -> Change:
        """What missed events may have changed: the list, and every URI listened to."""
        return Change(self.uris(), True)
