"""An agent knows where it is: `xum self` and the MCP tool `current_workspace` answer the
workspace whose checkout holds the current directory (by device and inode, not by a string
prefix), or the one `XUM_WORKSPACE_ID` names, with its ports, env and processes; anywhere else,
a clear `not_found`. And the MCP SDK stays out of everything but `xum mcp`."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agents.mcp_support import agent
from tests.support.daemon import XUM, DaemonProcess, serve
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def self_daemon() -> Iterator[DaemonProcess]:
    yield from serve("xum-self-", "")


@pytest.fixture(scope="module")
def spaces(self_daemon: DaemonProcess) -> dict[str, dict[str, Any]]:
    """Two workspaces whose paths share a prefix (`fix`, `fix-login`), one with env and a
    running process."""
    repo = make_repo(self_daemon.root.parent / "repo", {"README.md": "x\n", "sub/dir/f": "f\n"})
    project = add_project(self_daemon, repo)
    found = {}
    for name in ("fix", "fix-login"):
        found[name] = self_daemon.call(
            "workspace.create", {"project_id": project["id"], "name": name, "env": {"ROLE": name}}
        )["workspace"]
    self_daemon.call(
        "process.spawn",
        {"workspace_id": found["fix-login"]["id"], "kind": "agent", "argv": ["sleep", "600"]},
    )
    return found


def xum_self(
    daemon: DaemonProcess, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "XUM_WORKSPACE_ID"}
    return subprocess.run(
        [XUM, "--root", str(daemon.root), "--json", "self"],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_xum_self_answers_the_checkout_that_holds_the_cwd(
    self_daemon: DaemonProcess, spaces: dict[str, dict[str, Any]]
) -> None:
    login = spaces["fix-login"]
    done = xum_self(self_daemon, Path(login["path"]) / "sub" / "dir")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    # `fix` is a string prefix of `fix-login`'s path: the identity decides, not the text.
    assert answer["workspace"]["id"] == login["id"]
    assert answer["found_by"] == "cwd"
    assert answer["workspace"]["env"] == {"ROLE": "fix-login"}
    assert answer["workspace"]["ports"] == login["ports"]
    assert [p["argv"] for p in answer["processes"]] == [["sleep", "600"]]

    plain = subprocess.run(
        [XUM, "--root", str(self_daemon.root), "self"],
        cwd=login["path"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert plain.returncode == 0, plain.stderr
    assert login["id"] in plain.stdout
    assert "ROLE=fix-login" in plain.stdout
    assert "sleep 600" in plain.stdout


def test_xum_self_through_a_symlink_and_by_env(
    self_daemon: DaemonProcess, spaces: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    link = tmp_path / "link"
    link.symlink_to(spaces["fix"]["path"])
    done = xum_self(self_daemon, link / "sub")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["workspace"]["id"] == spaces["fix"]["id"]

    # The env wins over the directory.
    by_env = xum_self(
        self_daemon, Path(spaces["fix"]["path"]), {"XUM_WORKSPACE_ID": spaces["fix-login"]["id"]}
    )
    assert by_env.returncode == 0, by_env.stderr
    answer = json.loads(by_env.stdout)
    assert answer["workspace"]["id"] == spaces["fix-login"]["id"]
    assert answer["found_by"] == "env"


def test_xum_self_outside_any_workspace_is_not_found(
    self_daemon: DaemonProcess, spaces: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    # Beside the checkouts, in the directory that holds them: inside none.
    for where in (tmp_path, Path(spaces["fix"]["path"]).parent):
        done = xum_self(self_daemon, where)
        assert done.returncode == 3, done.stdout
        error = json.loads(done.stdout)["error"]
        assert error["kind"] == "not_found"
        assert "XUM_WORKSPACE_ID" in error["message"]
    unknown = xum_self(self_daemon, tmp_path, {"XUM_WORKSPACE_ID": "ws_0000000000000000"})
    assert unknown.returncode == 3
    assert "XUM_WORKSPACE_ID=ws_0000000000000000" in json.loads(unknown.stdout)["error"]["message"]


async def test_current_workspace_tool(
    self_daemon: DaemonProcess, spaces: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    login = spaces["fix-login"]
    async with agent(self_daemon, cwd=Path(login["path"]) / "sub") as a:
        here = await a.ok("current_workspace")
        assert here["workspace"]["id"] == login["id"]
        assert here["found_by"] == "cwd"
        assert here["workspace"]["env"] == {"ROLE": "fix-login"}
        assert here["processes"][0]["state"] == "running"
    async with agent(self_daemon, cwd=tmp_path) as a:
        nowhere = await a.error("current_workspace")
        assert nowhere["kind"] == "not_found"
    async with agent(self_daemon, cwd=tmp_path, env={"XUM_WORKSPACE_ID": spaces["fix"]["id"]}) as a:
        named = await a.ok("current_workspace")
        assert named["workspace"]["id"] == spaces["fix"]["id"]
        assert named["found_by"] == "env"


def _imports_mcp(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        if any(n.partition(".")[0] in ("mcp", "mcp_types") for n in names):
            return True
    return False


def test_only_the_mcp_server_imports_the_sdk() -> None:
    sources = [*(REPO / "daemon").rglob("*.py"), *(REPO / "protocol").rglob("*.py")]
    sources += (REPO / "clients" / "xum_client").rglob("*.py")
    importers = sorted(str(p.relative_to(REPO)) for p in sources if _imports_mcp(p))
    assert importers == ["clients/xum_client/mcp/server.py"]


def test_the_cli_loads_no_sdk_until_xum_mcp() -> None:
    # The click command line with every command module loaded (what `--help` does), `mcp`'s
    # own included: the SDK and its web stack stay unloaded until `xum mcp` runs.
    probe = """
import sys, click
from xum_client.cli import cli
ctx = click.Context(cli)
cli.list_commands(ctx)
assert cli.get_command(ctx, "mcp") is not None and cli.get_command(ctx, "self") is not None
heavy = ("mcp", "mcp_types", "starlette", "uvicorn", "httpx2", "jsonschema", "sse_starlette")
print(sorted(m for m in sys.modules if m.split(".")[0] in heavy or m.startswith("xum_client.mcp")))
print("xum_client.commands.mcp" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "True"]


def test_xum_mcp_without_the_sdk_says_how_to_get_it() -> None:
    # An install without the extra: `import mcp` fails as it would there.
    probe = (
        "import sys; sys.modules['mcp'] = None\nfrom xum_client.entry import main; main(['mcp'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert "pip install 'xum[mcp]'" in done.stderr
    assert "Traceback" not in done.stderr
