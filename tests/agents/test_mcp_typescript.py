"""`xum mcp` driven by a second, independent MCP client: the TypeScript SDK's
(`@modelcontextprotocol/sdk`, its `Client` over `StdioClientTransport`), from
tests/agents/ts_client (its packages from the lockfile: `make test` installs them when npm is
present). It lists the tools, creates a workspace, sees `busy` while a process holds it,
archives it with uncommitted work, reads the cleanup status and gets tool errors for bad input
(client.mjs asserts each step; the report it prints is checked here too)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.daemon import XUM, DaemonProcess
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project

HERE = Path(__file__).resolve().parent / "ts_client"


def _node_ready() -> None:
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed (CI installs them; see docs/DEVELOPING.md)")
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    if int(out.strip().lstrip("v").split(".")[0] or 0) < 20:
        pytest.skip(f"node {out.strip()} is too old: the MCP SDK needs Node >= 20")
    if not (HERE / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        pytest.skip("tests/agents/ts_client/node_modules is missing: run `make test` (npm ci)")


@pytest.mark.timeout(300)
def test_typescript_sdk_client(daemon: DaemonProcess, tmp_short: Path) -> None:
    _node_ready()
    project = add_project(daemon, make_repo(tmp_short / "repo"))
    env = {k: v for k, v in os.environ.items() if k not in ("XUM_SOCKET", "XUM_ROOT")}
    done = subprocess.run(
        ["node", "client.mjs", XUM, str(daemon.root), project["id"]],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "archive_workspace" in report["tools"]
    assert "current_workspace" in report["tools"]
    assert report["busy"]["kind"] == "busy"
    assert report["archived"]["snapshot"]["ref"]
    assert sorted(report["archived"]["snapshot"]["files"]) == ["README.md", "wip.txt"]
    assert report["cleanup"]["obligations"]
    assert report["archived"]["cleanup"]["status"] == "completed"
    # What the daemon itself says about the workspace now.
    (workspace,) = [
        w for w in daemon.call("workspace.list")["workspaces"] if w["name"] == "ts-agent"
    ]
    assert workspace["state"] == "archived"
    assert workspace["snapshot"]["ref"] == report["archived"]["snapshot"]["ref"]
