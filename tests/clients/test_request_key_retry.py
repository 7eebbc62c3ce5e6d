"""The Python clients' own retry of a mutating call whose answer was lost after it was sent
(docs/PROTOCOL.md, "Request keys"): a real daemon, a real connection cut by a proxy right after
it forwarded the request; the client reconnects and sends the call again with the same key, and
gets the first call's outcome: one workspace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from xum_client import AsyncClient, Client, ConnectionLost
from xum_client.sync import with_request_key

from tests.support.cutproxy import CuttingProxy
from tests.support.daemon import DaemonProcess, run_xum


def named(daemon: DaemonProcess, name: str) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = daemon.call("workspace.list")["workspaces"]
    return [w for w in listed if w["name"] == name]


def repeats(daemon: DaemonProcess) -> int:
    """How many times the daemon answered a keyed call from its first (waited or recorded)."""
    text = daemon.log_text()
    return text.count("rpc.request_key_waiting") + text.count("rpc.request_key_answered")


def test_the_sync_client_retries_a_cut_create_with_its_key(
    daemon: DaemonProcess, project: dict[str, Any], tmp_short: Path
) -> None:
    with (
        CuttingProxy(tmp_short / "p.sock", daemon.socket_path, b"workspace.create") as proxy,
        Client(daemon.root, socket_path=proxy.listen) as client,
    ):
        made = client.call("workspace.create", {"project_id": project["id"], "name": "a"})
    assert proxy.cut.is_set()
    assert [w["id"] for w in named(daemon, "a")] == [made["workspace"]["id"]]
    assert repeats(daemon) == 1


def test_the_async_client_retries_a_cut_archive_with_its_key(
    daemon: DaemonProcess, project: dict[str, Any], tmp_short: Path
) -> None:
    ws = daemon.call("workspace.create", {"project_id": project["id"], "name": "b"})["workspace"]

    async def scenario() -> dict[str, Any]:
        proxy = CuttingProxy(tmp_short / "p.sock", daemon.socket_path, b"workspace.archive")
        with proxy:
            async with AsyncClient(daemon.root, socket_path=proxy.listen) as client:
                return await client.call("workspace.archive", {"workspace_id": ws["id"]})

    archived = anyio.run(scenario)
    assert archived["workspace"]["state"] == "archived"  # not `invalid_state`
    assert repeats(daemon) == 1


def test_without_retry_the_cut_call_is_connection_lost_sent(
    daemon: DaemonProcess, project: dict[str, Any], tmp_short: Path
) -> None:
    with (
        CuttingProxy(tmp_short / "p.sock", daemon.socket_path, b"workspace.create") as proxy,
        Client(daemon.root, socket_path=proxy.listen, retry_lost=False) as client,
        pytest.raises(ConnectionLost) as lost,
    ):
        client.call("workspace.create", {"project_id": project["id"], "name": "c"})
    assert (lost.value.method, lost.value.sent) == ("workspace.create", True)


def test_keys_name_mutating_calls_only() -> None:
    keyed = with_request_key("workspace.create", {"name": "a"})
    assert isinstance(keyed, dict) and len(keyed["request_key"]) == 32
    assert with_request_key("workspace.create", {"request_key": "mine"}) == {"request_key": "mine"}
    assert with_request_key("workspace.list", {"limit": 1}) == {"limit": 1}
    other = with_request_key("workspace.create", {"name": "a"})
    assert isinstance(other, dict) and other["request_key"] != keyed["request_key"]


def test_the_cli_names_its_call_with_request_key(
    daemon: DaemonProcess, project: dict[str, Any]
) -> None:
    args = ("--json", "--request-key", "cli-new-d", "ws", "new", project["id"], "d")
    first = run_xum(daemon, *args)
    assert first.returncode == 0, first.stderr
    again = run_xum(daemon, *args)  # the same command again: its first outcome, not `conflict`
    assert again.returncode == 0, again.stderr
    made = json.loads(first.stdout)["workspace"]["id"]
    assert json.loads(again.stdout)["workspace"]["id"] == made
    assert [w["id"] for w in named(daemon, "d")] == [made]
    other = run_xum(daemon, "--json", "--request-key", "cli-new-d", "ws", "new", project["id"], "e")
    assert other.returncode != 0 and "invalid_params" in other.stdout + other.stderr
    bad = run_xum(daemon, "--request-key", "not a key", "ws", "ls")
    assert bad.returncode == 2 and "--request-key" in bad.stderr
