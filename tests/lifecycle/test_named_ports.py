"""Named service ports: `[ports] names` in a project's config gives each new workspace its first
ports by name (`XUM_PORT_<NAME>` for setup, teardown and every process; `named_ports` in the
workspace), a port is handed out only when nothing listens on it on any interface, and a port
that a process outside the workspace took since allocation is reported by `workspace.get` and
replaced on request (`workspace.reallocate_ports`), its name kept. Real daemons, real listening
sockets, real processes (one of the workspace's own, one foreign)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.lifecycle.test_workspace_env_ports import (
    env_lines,
    listening,
    port_range,
    ports_config,
    started,
    with_config,
    xum,
)
from tests.support.daemon import DaemonProcess, write_config
from tests.support.lifecycle_helpers import add_project, create, rpc_error
from tests.support.wait import until

LISTENER = (
    "import os, socket, sys\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1])))\n"
    "s.listen()\n"
    "print('listening', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_named_ports_reach_every_child_and_the_workspace(tmp_short: Path, repo: Path) -> None:
    start, end = port_range(20)
    with_config(
        repo,
        '[scripts]\nsetup = ["env > setup.env"]\n[ports]\nnames = ["web", "api_v2"]\ncount = 3\n',
    )
    daemon = started(tmp_short / "root", ports_config(start, end))
    try:
        project = add_project(daemon, repo)
        daemon.call("project.trust", {"project_id": project["id"]})
        ws = create(daemon, project["id"], "named")["workspace"]
        web, api, anonymous = ws["ports"]
        assert ws["named_ports"] == {"web": web, "api_v2": api}
        assert anonymous not in ws["named_ports"].values()
        wanted = {f"XUM_PORT_WEB={web}", f"XUM_PORT_API_V2={api}", f"XUM_PORT={web}"}
        in_setup = set(env_lines((Path(ws["path"]) / "setup.env").read_text()))
        assert wanted <= in_setup
        run = xum(daemon, "run", ws["id"], "--", "env")
        assert run.returncode == 0, run.stderr
        assert wanted <= set(env_lines(run.stdout))
        shown = xum(daemon, "ws", "show", ws["id"])
        assert f"web={web}" in shown.stdout and f"api_v2={api}" in shown.stdout
        listed = daemon.call("workspace.list")["workspaces"]
        assert listed[0]["named_ports"] == ws["named_ports"]
    finally:
        daemon.close()


def test_a_name_inherited_from_the_daemons_environment_never_leaks(
    tmp_short: Path, repo: Path
) -> None:
    start, end = port_range(5)
    with_config(repo, "[ports]\ncount = 1\n")
    write_config(tmp_short / "root", ports_config(start, end))
    daemon = DaemonProcess(tmp_short / "root", env={"XUM_PORT_STALE": "1"}).start()
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "clean")["workspace"]
        run = xum(daemon, "run", ws["id"], "--", "env")
        assert run.returncode == 0, run.stderr
        assert not [line for line in run.stdout.splitlines() if line.startswith("XUM_PORT_")]
    finally:
        daemon.close()


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ('[ports]\nnames = ["Web"]\n', "'Web' is not a port name"),
        ('[ports]\nnames = ["web", "web"]\n', "a name is given twice"),
        ('[ports]\nnames = "web"\n', "must be a list of strings"),
        ('[ports]\nnames = ["a-b"]\n', "'a-b' is not a port name"),
        ('[ports]\nnames = ["web", "api"]\ncount = 1\n', "below the number of names"),
    ],
)
def test_bad_names_refuse_the_create_before_anything_is_made(
    tmp_short: Path, repo: Path, config: str, says: str
) -> None:
    start, end = port_range(5)
    with_config(repo, config)
    daemon = started(tmp_short / "root", ports_config(start, end))
    try:
        project = add_project(daemon, repo)
        error = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "x"})
        assert error.kind == "invalid_params" and says in str(error), error
        assert daemon.call("workspace.list")["workspaces"] == []
    finally:
        daemon.close()


def _outside_address() -> str:
    """An address of this machine that is not a loopback one (a listener there leaves the
    loopback ports free)."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return str(address.address)
    pytest.skip("no non-loopback IPv4 address on this machine")


def test_a_port_held_on_another_interface_is_skipped(tmp_short: Path, repo: Path) -> None:
    start, end = port_range(3)
    daemon = started(tmp_short / "root", ports_config(start, end, count=1))
    try:
        project = add_project(daemon, repo)
        with listening(start, _outside_address()):
            ws = create(daemon, project["id"], "elsewhere")["workspace"]
        assert ws["ports"] == [start + 1]
    finally:
        daemon.close()


def test_a_port_taken_by_a_foreign_process_is_reported_and_replaced_on_request(
    tmp_short: Path, repo: Path
) -> None:
    start, end = port_range(20)
    with_config(repo, '[ports]\nnames = ["web", "db"]\n')
    daemon = started(tmp_short / "root", ports_config(start, end))
    foreign: subprocess.Popen[str] | None = None
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "svc")["workspace"]
        web, db = ws["named_ports"]["web"], ws["named_ports"]["db"]
        # The workspace's own server on its web port: what the port is for, not reported.
        own = daemon.call(
            "process.spawn",
            {
                "workspace_id": ws["id"],
                "kind": "agent",
                "argv": [sys.executable, "-c", LISTENER, str(web)],
            },
        )["process"]
        until(lambda: not _free(web), message="the workspace's own server listening")
        got = daemon.call("workspace.get", {"workspace_id": ws["id"]})
        assert got["ports_taken"] == []
        # A process outside the workspace takes its db port.
        foreign = subprocess.Popen(
            [sys.executable, "-c", LISTENER, str(db)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert foreign.stdout is not None and foreign.stdout.readline().strip() == "listening"
        got = daemon.call("workspace.get", {"workspace_id": ws["id"]})
        taken = got["ports_taken"]
        assert [(t["port"], t["name"], t["pid"]) for t in taken] == [(db, "db", foreign.pid)]
        assert "python" in (taken[0]["command"] or "")
        # Replaced on request: a new port at the same name; the web port (the workspace's own
        # server) stays.
        moved = daemon.call("workspace.reallocate_ports", {"workspace_id": ws["id"]})
        new_db = moved["workspace"]["named_ports"]["db"]
        assert moved["changes"] == [{"old": db, "new": new_db}] and new_db != db
        assert moved["workspace"]["named_ports"]["web"] == web
        run = xum(daemon, "run", ws["id"], "--", "env")
        assert f"XUM_PORT_DB={new_db}" in run.stdout
        # Asking for a port the workspace does not hold is refused, nothing changed.
        error = rpc_error(
            daemon, "workspace.reallocate_ports", {"workspace_id": ws["id"], "ports": [db]}
        )
        assert error.kind == "invalid_params" and str(db) in str(error)
        daemon.call("process.stop", {"process_id": own["id"]})
    finally:
        if foreign is not None:
            foreign.kill()
            foreign.wait(timeout=10)
        daemon.close()


def test_a_replaced_port_at_unarchive_keeps_its_name(tmp_short: Path, repo: Path) -> None:
    start, end = port_range(10)
    with_config(repo, '[ports]\nnames = ["web"]\n')
    daemon = started(tmp_short / "root", ports_config(start, end))
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "n")["workspace"]
        web = ws["named_ports"]["web"]
        daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        with listening(web):
            back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
        new = back["workspace"]["named_ports"]["web"]
        assert new != web and back["ports_replaced"] == [{"old": web, "new": new}]
    finally:
        daemon.close()


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
