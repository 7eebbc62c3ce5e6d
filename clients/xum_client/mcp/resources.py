"""The MCP resources: the workspace list, and each workspace's status, read from the daemon when
asked (nothing is cached here); and which of them a daemon event changes, for the change
notifications (`server.py` sends them)."""

from __future__ import annotations

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
