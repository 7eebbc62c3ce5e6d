"""`xum ws ls`: the whole listing a page at a time, or the one page asked for."""

from __future__ import annotations

from typing import Any

import click
from xum_protocol.cursor import check_given_cursor
from xum_protocol.version import parse_version

from xum_client.sync import Client


def _pages(client: Client) -> bool:
    """The daemon takes `limit`/`after` (protocol 1.2). Without a handshake the daemon speaks
    its own current version, which is this package's."""
    server = client.server
    if server is None or not isinstance(server.get("protocol"), str):
        return True
    try:
        return parse_version(server["protocol"]) >= (1, 2)
    except ValueError:
        return True


def list_workspaces(
    client: Client, filters: dict[str, Any], limit: int | None, after: str | None
) -> dict[str, Any]:
    """`workspace.list`'s answer: with `limit` (or `after`) one page as asked; else every page,
    joined (`next` null). An older daemon gets the unpaged call it understands."""
    if limit is not None or after is not None:
        if after is not None:
            try:
                check_given_cursor(after)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint="--after") from None
        if not _pages(client):
            raise click.UsageError("--limit and --after need a daemon of protocol 1.2 or later")
        params = dict(filters)
        if limit is not None:
            params["limit"] = limit
        if after is not None:
            params["after"] = after
        return client.call("workspace.list", params)
    if not _pages(client):
        return client.call("workspace.list", filters)
    return {"workspaces": list(client.iter_workspaces(filters)), "next": None}
