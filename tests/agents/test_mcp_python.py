"""`xum mcp` driven by the MCP Python SDK's own stdio client against a real daemon: the tools and
their schemas (the protocol's), the contract's answers (snapshot, cleanup, `busy` with its
holders, `not_safe`), tool errors for bad input, the resources and their change notifications
(across a daemon restart), and `current_workspace`."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import MCPError
from xum_protocol.methods import METHODS
from xum_protocol.request_keys import json_schema

from tests.agents.mcp_support import agent, agent_with, list_changed, updated
from tests.support.cutproxy import CuttingProxy
from tests.support.daemon import DaemonProcess, serve, short_tmpdir
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project

# The SDK's client warns that `resources/subscribe` is gone from the 2026-07-28 protocol; the
# handshake's protocol (what these clients and the TypeScript SDK's speak) has it.
pytestmark = pytest.mark.filterwarnings("ignore:resources/subscribe is removed")

METHOD_TOOLS = {
    "daemon_status": "daemon.status",
    "list_projects": "project.list",
    "list_workspaces": "workspace.list",
    "show_workspace": "workspace.get",
    "create_workspace": "workspace.create",
    "archive_workspace": "workspace.archive",
    "unarchive_workspace": "workspace.unarchive",
    "remove_workspace": "workspace.remove",
    "rename_workspace": "workspace.rename",
    "start_process": "process.spawn",
    "stop_process": "process.stop",
    "list_processes": "process.list",
    "disk_usage": "workspace.usage",
    "gc_plan": "gc.plan",
    "cleanup_status": "cleanup.list",
    "cleanup_retry": "cleanup.retry",
}
DESTRUCTIVE = {"archive_workspace", "remove_workspace", "stop_process", "run_command"}


@pytest.fixture(scope="module")
def mcp_daemon() -> Iterator[DaemonProcess]:
    yield from serve("xum-mcp-", "")


@pytest.fixture(scope="module")
def repo(mcp_daemon: DaemonProcess) -> Path:
    return make_repo(mcp_daemon.root.parent / "repo", {"README.md": "hello\n", "src/a.py": "a\n"})


@pytest.fixture(scope="module")
def project(mcp_daemon: DaemonProcess, repo: Path) -> dict[str, Any]:
    return add_project(mcp_daemon, repo)


@pytest.fixture
def holder() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait(10)


async def test_tools_are_the_protocols_methods(mcp_daemon: DaemonProcess) -> None:
    async with agent(mcp_daemon) as a:
        listed = {tool.name: tool for tool in (await a.session.list_tools()).tools}
    assert set(METHOD_TOOLS) | {"run_command", "current_workspace"} == set(listed)
    for name, method in METHOD_TOOLS.items():
        spec = METHODS[method]
        wanted = spec.params.model_json_schema()
        if spec.mutating:  # an agent may name its call for a safe retry of its own
            properties = {**wanted.get("properties", {}), "request_key": json_schema()}
            wanted = {**wanted, "properties": properties}
        assert listed[name].input_schema == wanted, name
        assert listed[name].output_schema == spec.result.model_json_schema(), name
    for name, tool in listed.items():
        assert tool.annotations is not None
        assert tool.annotations.destructive_hint is (name in DESTRUCTIVE), name
    assert listed["list_workspaces"].annotations.read_only_hint is True  # type: ignore[union-attr]


async def test_a_create_whose_answer_was_lost_is_retried_with_its_key(
    mcp_daemon: DaemonProcess, project: dict[str, Any]
) -> None:
    """The MCP server's connection to the daemon is cut right after it sent the create: it
    sends it again with the same request key and the agent gets the one workspace made."""
    where = short_tmpdir("xmp-")
    proxy = CuttingProxy(where / "p.sock", mcp_daemon.socket_path, b"workspace.create")
    with proxy:
        async with agent_with(["--socket", str(proxy.listen), "mcp"]) as a:
            made = await a.ok("create_workspace", {"project_id": project["id"], "name": "cut"})
    assert proxy.cut.is_set()
    listed = mcp_daemon.call("workspace.list")["workspaces"]
    assert [w["id"] for w in listed if w["name"] == "cut"] == [made["workspace"]["id"]]


async def test_archive_with_uncommitted_work_busy_then_cleanup(
    mcp_daemon: DaemonProcess, project: dict[str, Any], holder: subprocess.Popen[bytes]
) -> None:
    async with agent(mcp_daemon) as a:
        created = await a.ok("create_workspace", {"project_id": project["id"], "name": "arch"})
        ws = created["workspace"]
        assert ws["state"] == "active"
        checkout = Path(ws["path"])
        (checkout / "README.md").write_text("changed\n")
        (checkout / "notes.txt").write_text("untracked work\n")
        uri = f"xum://workspace/{ws['id']}"
        await a.session.subscribe_resource(uri)

        lease = mcp_daemon.call(
            "lease.acquire", {"workspace_id": ws["id"], "kind": "editor", "pid": holder.pid}
        )["lease"]
        busy = await a.error("archive_workspace", {"workspace_id": ws["id"]})
        assert busy["kind"] == "busy"
        assert busy["code"] == -32002
        pids = [h["pid"] for h in busy["data"]["holders"]]
        assert holder.pid in pids
        assert len(busy["free"]) == len(busy["data"]["holders"])
        assert any(f"pid {holder.pid}" in free for free in busy["free"])
        assert (checkout / "notes.txt").exists()  # nothing was changed

        mcp_daemon.call("lease.release", {"lease_id": lease["id"]})
        result = await a.call("archive_workspace", {"workspace_id": ws["id"]})
        assert not result.is_error
        archived = result.structured_content
        assert isinstance(archived, dict)
        assert archived["workspace"]["state"] == "archived"
        assert archived["workspace"]["interrupted"] is False
        assert set(archived["snapshot"]["files"]) == {"README.md", "notes.txt"}
        assert archived["snapshot"]["ref"]
        assert archived["cleanup"]["status"] == "completed"
        text = result.content[0]
        assert isinstance(text, types.TextContent)
        assert f"snapshot: {archived['snapshot']['ref']} (2 file(s) saved)" in text.text
        assert "cleanup: completed" in text.text
        await a.notified(updated(uri))

        # The checkout went (cleanup completed); the trashed copy's reclaim may still run.
        assert archived["cleanup"]["reclaim"]["status"] in ("completed", "pending")
        status = await a.ok("cleanup_status", {"workspace_id": ws["id"]})
        obligations = status["obligations"]
        assert obligations
        assert all(o["workspace_id"] == ws["id"] for o in obligations)
        left = [o for o in obligations if o["state"] != "completed"]
        assert all(o["kind"] == "reclaim" and o["state"] == "pending" for o in left), left
        retried = await a.ok("cleanup_retry", {"workspace_id": ws["id"]})
        assert all(o["workspace_id"] == ws["id"] for o in retried["attempted"])
        with anyio.fail_after(20):
            while (await a.ok("cleanup_status", {"workspace_id": ws["id"]}))["pending"]:
                await anyio.sleep(0.05)

        back = await a.ok("unarchive_workspace", {"workspace_id": ws["id"]})
        assert back["workspace"]["state"] == "active"
        assert (checkout / "notes.txt").read_text() == "untracked work\n"


async def test_remove_refuses_unsaved_work_without_force(
    mcp_daemon: DaemonProcess, project: dict[str, Any]
) -> None:
    async with agent(mcp_daemon) as a:
        ws = (await a.ok("create_workspace", {"project_id": project["id"], "name": "rm"}))[
            "workspace"
        ]
        (Path(ws["path"]) / "unsaved.txt").write_text("work\n")
        refused = await a.error("remove_workspace", {"workspace_id": ws["id"]})
        assert refused["kind"] == "not_safe"
        assert (Path(ws["path"]) / "unsaved.txt").exists()
        removed = await a.ok("remove_workspace", {"workspace_id": ws["id"], "force": True})
        assert removed["removed"] is True
        assert removed["snapshot"]["files"] == ["unsaved.txt"]
        assert removed["cleanup"]["status"] == "completed"
        assert not Path(ws["path"]).exists()


async def test_bad_input_is_a_clear_tool_error(mcp_daemon: DaemonProcess) -> None:
    async with agent(mcp_daemon) as a:
        unknown = await a.error("no_such_tool", {})
        assert unknown["kind"] == "method_not_found"
        assert "archive_workspace" in unknown["message"]  # it names the tools there are
        wrong = await a.error("archive_workspace", {"workspace_id": 5})
        assert wrong["kind"] == "invalid_params"
        assert "workspace_id" in wrong["message"]
        extra = await a.error("show_workspace", {"workspace_id": "ws_x", "bogus": 1})
        assert extra["kind"] == "invalid_params"
        missing = await a.error("show_workspace", {"workspace_id": "ws_0000000000000000"})
        assert missing["kind"] == "not_found"
        composed = await a.error("run_command", {"workspace_id": "ws_x", "argv": "ls"})
        assert composed["kind"] == "invalid_params"
        assert "argv" in composed["message"]
        bad_name = await a.error("create_workspace", {"project_id": "prj_x", "name": "../escape"})
        assert bad_name["kind"] in ("invalid_name", "not_found")


async def test_run_command_returns_bounded_output(
    mcp_daemon: DaemonProcess, project: dict[str, Any]
) -> None:
    async with agent(mcp_daemon) as a:
        ws = (await a.ok("create_workspace", {"project_id": project["id"], "name": "run"}))[
            "workspace"
        ]
        done = await a.ok(
            "run_command",
            {
                "workspace_id": ws["id"],
                "argv": [
                    "sh",
                    "-c",
                    "printf 'start-'; seq 1 2000 | tr -d '\\n'; echo; pwd; exit 3",
                ],
                "max_bytes": 100,
            },
        )
        assert done["exit"]["code"] == 3
        assert done["timed_out"] is False
        assert done["output"].endswith(ws["path"] + "\n")
        assert len(done["output"].encode()) == 100
        assert done["output_omitted"] == done["output_bytes"] - 100 > 0

        slow = await a.ok(
            "run_command", {"workspace_id": ws["id"], "argv": ["sleep", "600"], "timeout_s": 0.5}
        )
        assert slow["timed_out"] is True
        assert slow["process"]["state"] == "exited"
        assert slow["exit"]["stop_reason"] == "request"


async def test_resources_list_read_and_change_notifications(
    mcp_daemon: DaemonProcess, project: dict[str, Any]
) -> None:
    async with agent(mcp_daemon) as a:
        await a.session.subscribe_resource("xum://workspaces")
        ws = (await a.ok("create_workspace", {"project_id": project["id"], "name": "res"}))[
            "workspace"
        ]
        await a.notified(list_changed)
        await a.notified(updated("xum://workspaces"))
        listed = {str(r.uri) for r in (await a.session.list_resources()).resources}
        assert {"xum://workspaces", f"xum://workspace/{ws['id']}"} <= listed
        read = await a.session.read_resource(f"xum://workspace/{ws['id']}")
        content = read.contents[0]
        assert isinstance(content, types.TextResourceContents)
        assert f'"id": "{ws["id"]}"' in content.text
        assert '"state": "active"' in content.text
        for unknown in ("xum://workspace/ws_0000000000000000", "xum://nothing"):
            with pytest.raises(MCPError) as info:
                await a.session.read_resource(unknown)
            assert info.value.code == -32002  # MCP's "resource not found"

        # The daemon restarts: the watcher's stream ends, it reconnects (another epoch: a
        # resync, so every resource may have changed) and follows the new run's events.
        a.forget()
        mcp_daemon.terminate()
        mcp_daemon.start()
        await a.notified(list_changed, timeout=30)
        await a.ok("rename_workspace", {"workspace_id": ws["id"], "name": "res2"})
        await a.notified(updated("xum://workspaces"))
        await a.notified(list_changed)


async def test_started_before_the_daemon(tmp_short: Path) -> None:
    # No daemon yet: tools say so; when one starts, the watcher finds it and says every
    # resource may have changed (what was read before was an error).
    daemon = DaemonProcess(tmp_short / "root")
    daemon.root.mkdir(mode=0o700)
    async with agent(daemon) as a:
        absent = await a.error("daemon_status")
        assert absent["kind"] == "no_daemon"
        await a.session.subscribe_resource("xum://workspaces")
        daemon.start()
        try:
            await a.notified(list_changed, timeout=30)
            assert (await a.ok("daemon_status"))["pid"] == daemon.pid
        finally:
            daemon.close()
