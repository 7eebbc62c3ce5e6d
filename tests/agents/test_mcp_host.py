"""`xum --host NAME mcp`: the MCP server reaches another machine's daemon through ssh and the
bridge (a real OpenSSH server on loopback: tests/support/sshd.py), and its tools act there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from xum_client.hosts import HostEntry, add_host

from tests.agents.mcp_support import agent_with
from tests.support.daemon import XUM, short_tmpdir
from tests.support.gitrepo import make_repo
from tests.support.sshd import ALIAS, SshServer, stop_root_daemon


@pytest.fixture
def host_env(tmp_short: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Host `h1`: this machine through a loopback sshd, its daemon on a root of the test's."""
    base = short_tmpdir("xsm-")
    server = SshServer(base).start()
    env = {**server.env(), "XUM_HOSTS_FILE": str(tmp_short / "hosts.toml")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("XUM_HOST", raising=False)
    remote_root = tmp_short / "remote-root"
    add_host(HostEntry("h1", ALIAS, str(remote_root)))
    try:
        yield env
    finally:
        stop_root_daemon(remote_root)
        server.close()
        shutil.rmtree(base, ignore_errors=True)


async def test_xum_mcp_through_a_host(host_env: dict[str, str], tmp_short: Path) -> None:
    repo = make_repo(tmp_short / "repo")
    added = subprocess.run(
        [XUM, "--host", "h1", "--json", "project", "add", str(repo)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **host_env},
    )
    assert added.returncode == 0, added.stderr
    project = json.loads(added.stdout)["project"]
    async with agent_with(["--host", "h1", "mcp"], env=host_env) as a:
        status = await a.ok("daemon_status")
        assert status["root"] == str(tmp_short / "remote-root")
        ws = (await a.ok("create_workspace", {"project_id": project["id"], "name": "far"}))[
            "workspace"
        ]
        ran = await a.ok("run_command", {"workspace_id": ws["id"], "argv": ["pwd"]})
        assert ran["output"] == ws["path"] + "\n"
        assert ran["exit"]["code"] == 0
        # The current directory is this machine's: through a host, only the env says it.
        nowhere = await a.error("current_workspace")
        assert nowhere["kind"] == "not_found"
        assert "XUM_WORKSPACE_ID" in nowhere["message"]
    async with agent_with(
        ["--host", "h1", "mcp"], env={**host_env, "XUM_WORKSPACE_ID": ws["id"]}
    ) as a:
        here = await a.ok("current_workspace")
        assert here["workspace"]["id"] == ws["id"]
        assert here["found_by"] == "env"
