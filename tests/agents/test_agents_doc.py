"""docs/AGENTS.md says true things: every MCP server configuration it shows parses, and its command
starts `xum mcp` that a real MCP client (the Python SDK's) talks to against a real daemon; its
tool table is the server's."""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from xum_client.mcp.tools import TOOLS

from tests.support.daemon import DaemonProcess

DOC = Path(__file__).resolve().parents[2] / "docs" / "AGENTS.md"
BLOCK = re.compile(r"^```(json|toml)\n(.*?)^```$", re.M | re.S)


def servers() -> list[dict[str, Any]]:
    """Every server entry of every configuration block, as the agent would read it."""
    found = []
    for lang, text in BLOCK.findall(DOC.read_text()):
        config = json.loads(text) if lang == "json" else tomllib.loads(text)
        (lists,) = [config[k] for k in ("mcpServers", "servers", "mcp_servers") if k in config]
        found.extend(lists.values())
    return found


def test_every_example_parses_and_names_xum_mcp() -> None:
    entries = servers()
    assert len(entries) == 5
    for entry in entries:
        assert entry["command"] == "xum"
        assert entry["args"][-1] == "mcp"
        assert entry.get("type", "stdio") == "stdio"
    hosts = [e for e in entries if "--host" in e["args"]]
    assert [e["args"] for e in hosts] == [["--host", "devbox", "mcp"]]


async def test_each_local_example_starts_a_working_server(daemon: DaemonProcess) -> None:
    bin_dir = str(Path(sys.executable).parent)
    base = {k: v for k, v in os.environ.items() if k not in ("XUM_SOCKET", "XUM_WORKSPACE_ID")}
    base["PATH"] = bin_dir + os.pathsep + base.get("PATH", "")
    base["XUM_ROOT"] = str(daemon.root)
    for entry in servers():
        if "--host" in entry["args"]:
            continue  # no ssh host here: tests/hosts drive `--host` itself
        env = {**base, **entry.get("env", {})}
        if "XUM_ROOT" in entry.get("env", {}):
            env["XUM_ROOT"] = str(daemon.root)  # the example's own root, made this daemon's
        params = StdioServerParameters(command=entry["command"], args=entry["args"], env=env)
        async with (
            stdio_client(params) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert names == set(TOOLS)
            status = await session.call_tool("daemon_status", {})
            assert isinstance(status, types.CallToolResult)
            assert not status.is_error
            assert isinstance(status.structured_content, dict)
            assert status.structured_content["pid"] == daemon.pid


def test_the_tool_table_is_the_servers() -> None:
    rows = re.findall(r"^\| `(\w+)` \| (.*?) \|(.*?)\|$", DOC.read_text(), re.M)
    assert {name for name, _, _ in rows} == set(TOOLS)
    for name, methods, notes in rows:
        tool = TOOLS[name]
        if tool.method is not None:
            assert methods == f"`{tool.method}`", name
        assert ("destructive" in notes) is tool.destructive, name
        assert ("read-only" in notes) is tool.read_only, name
