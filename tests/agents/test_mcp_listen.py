"""`xum mcp` at the 2026-07-28 revision, driven by the MCP Python SDK's own `Client` (it asks
`server/discover`, then opens `subscriptions/listen` streams) against a real daemon: what the
server advertises and what a stream's acknowledgment honors, the list change when a workspace is
made through the daemon (a handshake-era agent, alongside, still gets its notifications), an
update for a listened workspace and none for another, and every listened resource after a
daemon restart."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest
from mcp.client.subscriptions import ResourcesListChanged, ResourceUpdated, ServerEvent

from tests.agents.mcp_support import agent, events, list_changed, modern, updated
from tests.support.daemon import DaemonProcess

# The handshake-era agent here subscribes with `resources/subscribe`, which the SDK's client
# warns is gone from 2026-07-28.
pytestmark = pytest.mark.filterwarnings("ignore:resources/subscribe is removed")

LIST = "xum://workspaces"


def uri(workspace: dict[str, Any]) -> str:
    return f"xum://workspace/{workspace['id']}"


def create(daemon: DaemonProcess, project: dict[str, Any], name: str) -> dict[str, Any]:
    made: dict[str, Any] = daemon.call(
        "workspace.create", {"project_id": project["id"], "name": name}
    )["workspace"]
    return made


async def test_discover_says_listen_and_the_ack_honors_the_resource_kinds(
    daemon: DaemonProcess,
) -> None:
    async with modern(daemon) as client:
        assert client.protocol_version == "2026-07-28"
        said = client.server_capabilities
        assert said.resources is not None
        assert said.resources.subscribe is True
        assert said.resources.list_changed is True
        # Its tools never change and it has no prompts: nothing to listen for there.
        assert said.tools is not None
        assert not said.tools.list_changed
        assert said.prompts is None
        async with client.listen(
            tools_list_changed=True,
            prompts_list_changed=True,
            resources_list_changed=True,
            resource_subscriptions=[LIST],
        ) as stream:
            assert stream.honored == types.SubscriptionFilter(
                resources_list_changed=True, resource_subscriptions=[LIST]
            )
    async with agent(daemon) as a:  # the handshake says the same of the resources
        handshake = a.session.server_capabilities
        assert handshake is not None
        assert handshake.resources is not None
        assert handshake.resources.subscribe is True
        assert handshake.resources.list_changed is True
        assert handshake.tools is not None
        assert not handshake.tools.list_changed


async def test_a_workspace_made_through_the_daemon_is_a_list_change_in_both_eras(
    daemon: DaemonProcess, project: dict[str, Any]
) -> None:
    async with modern(daemon) as client, agent(daemon) as older:
        await older.session.subscribe_resource(LIST)
        async with client.listen(resources_list_changed=True) as stream:
            made = create(daemon, project, "made")
            assert await events(stream, lambda e: isinstance(e, ResourcesListChanged)) == [
                ResourcesListChanged()
            ]
            listed = {str(r.uri) for r in (await client.list_resources()).resources}
            assert uri(made) in listed
        await older.notified(list_changed)
        await older.notified(updated(LIST))


async def test_a_listened_workspace_gets_its_update_and_another_none(
    daemon: DaemonProcess, project: dict[str, Any]
) -> None:
    one = create(daemon, project, "one")
    other = create(daemon, project, "other")
    async with modern(daemon) as client, client.listen(resource_subscriptions=[uri(one)]) as stream:
        # The other's changes come first on the daemon's event stream: had the server sent
        # them (its URI, the list's), they would come first here too (the SDK's client takes
        # any `updated` once the stream has URIs).
        daemon.call("workspace.rename", {"workspace_id": other["id"], "name": "other2"})
        daemon.call("workspace.archive", {"workspace_id": one["id"]})
        first = ResourceUpdated(uri(one))
        assert await events(stream, lambda e: e == first) == [first]
        read = await client.read_resource(uri(one))
        content = read.contents[0]
        assert isinstance(content, types.TextResourceContents)
        assert '"state": "archived"' in content.text


async def test_after_a_daemon_restart_every_listened_resource_may_have_changed(
    daemon: DaemonProcess, project: dict[str, Any]
) -> None:
    ws = create(daemon, project, "kept")
    wanted: set[ServerEvent] = {
        ResourcesListChanged(),
        ResourceUpdated(uri(ws)),
        ResourceUpdated(LIST),
    }
    async with (
        modern(daemon) as client,
        client.listen(
            resources_list_changed=True, resource_subscriptions=[uri(ws), LIST]
        ) as stream,
    ):
        # The watcher's stream ends, it reconnects to the new run (another epoch: events
        # were missed), and each listened resource is said to be updated, with the list.
        daemon.terminate()
        daemon.start()
        seen: set[ServerEvent] = set()

        def all_said(event: ServerEvent) -> bool:
            seen.add(event)
            return wanted <= seen

        await events(stream, all_said, timeout=30)
        assert seen == wanted
