"""`hello` compares xum releases: a client refuses a daemon of another major.minor, naming both
(client side: `version_mismatch`), and the commands that must reach any daemon still do."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import anyio
import pytest
import xumd
from xum_client import AsyncClient, Client
from xum_client import sync as sync_module
from xum_client.errors import VersionMismatch
from xum_client.sync import CLIENT_VERSION, check_release, release_line

from tests.support.daemon import DaemonProcess
from tests.support.wait import until

REPO = Path(__file__).resolve().parents[2]

# A CLI run whose client claims another release: the real CLI, one constant changed first.
CLAIMING = (
    "import sys, xum_client.sync as s; s.CLIENT_VERSION = sys.argv[1]; "
    "from xum_client.cli import main; main(sys.argv[2:])"
)


def xum_claiming(version: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CLAIMING, version, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_versions_of_one_release_agree() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["version"] == xumd.__version__ == CLIENT_VERSION


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("0.1.0", (0, 1)),
        ("1.2.3rc1", (1, 2)),
        ("0.1.0+local", (0, 1)),
        ("2.10", (2, 10)),
        ("dev", None),
        ("1", None),
        ("", None),
        ("1.x", None),
    ],
)
def test_release_line(text: str, line: tuple[int, int] | None) -> None:
    assert release_line(text) == line


def test_an_unreadable_server_version_is_a_mismatch() -> None:
    servers: list[dict[str, object]] = [{}, {"server": {}}, {"server": {"version": "dev"}}]
    for server in [*servers, {"server": "x"}]:
        with pytest.raises(VersionMismatch) as caught:
            check_release(server, "on /r", "hint")
        assert caught.value.client_version == CLIENT_VERSION


def test_a_client_of_another_minor_refuses_naming_both(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = xumd.__version__
    monkeypatch.setattr(sync_module, "CLIENT_VERSION", "0.99.0")
    with pytest.raises(VersionMismatch) as caught:
        Client(daemon.root)
    error = caught.value
    assert error.kind == "version_mismatch"
    assert error.data == {
        "client_version": "0.99.0",
        "server_version": theirs,
        "where": f"on {daemon.root}",
    }
    assert "xum 0.99.0" in str(error) and f"xumd {theirs}" in str(error)
    assert "xum daemon stop" in str(error)
    # The refused connection was closed, not leaked: the daemon counts only this one.
    with Client(daemon.root, check_version=False) as client:
        until(lambda: client.call("daemon.status")["connections"] == 1, timeout=10)


def test_a_client_of_another_patch_release_is_accepted(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    major, minor = release_line(xumd.__version__) or (0, 0)
    monkeypatch.setattr(sync_module, "CLIENT_VERSION", f"{major}.{minor}.97")
    with Client(daemon.root) as client:
        assert client.server is not None
        # The client told the daemon which release it is.
        assert client.call("daemon.status")["version"] == xumd.__version__


def test_the_async_client_refuses_too(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sync_module, "CLIENT_VERSION", "7.0.0")

    async def main() -> None:
        with pytest.raises(VersionMismatch, match=r"xum 7\.0\.0 .* xumd "):
            async with AsyncClient(daemon.root):
                pass
        async with AsyncClient(daemon.root, check_version=False) as client:
            assert client.server is not None

    anyio.run(main)


def test_cli_says_both_versions_in_one_line_and_json(daemon: DaemonProcess) -> None:
    done = xum_claiming("0.99.0", "--root", str(daemon.root), "status")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "xum 0.99.0" in lines[0] and f"xumd {xumd.__version__}" in lines[0]
    done = xum_claiming("0.99.0", "--root", str(daemon.root), "ws", "ls", "--json")
    assert done.returncode == 1
    error = json.loads(done.stdout)["error"]
    assert error["kind"] == "version_mismatch"
    assert error["data"]["client_version"] == "0.99.0"
    assert error["data"]["server_version"] == xumd.__version__


def test_daemon_status_and_stop_reach_a_daemon_of_another_version(
    daemon: DaemonProcess,
) -> None:
    done = xum_claiming("0.99.0", "--root", str(daemon.root), "daemon", "status", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["version"] == xumd.__version__
    done = xum_claiming("0.99.0", "--root", str(daemon.root), "daemon", "stop")
    assert done.returncode == 0, done.stderr
    assert daemon.proc is not None
    assert daemon.proc.wait(timeout=30) == 0
