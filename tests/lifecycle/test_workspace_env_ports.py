"""Ports per workspace (durable, unique across the root, checked
free, kept while archived, released with the row, reconciled after a crash) and the environment
(`[env]`, `workspace.create {env}`, the XUM_* variables) given to setup, teardown and every
process, with real scripts, a real `xum run`, real listening sockets and a real SIGKILL."""

from __future__ import annotations

import os
import random
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import git
from tests.support.lifecycle_helpers import add_project, create, rpc_error, worktrees

XUM = [sys.executable, "-c", "from xum_client.cli import main; main()"]
SHOWN = "XUM_|FOO=|BAR="


def port_range(size: int) -> tuple[int, int]:
    """A range of its own per test: other roots on this machine allocate from theirs."""
    start = random.randrange(30000, 60000 - size)
    return start, start + size - 1


def ports_config(start: int, end: int, count: int = 0) -> str:
    return f"[ports]\ncount = {count}\nrange_start = {start}\nrange_end = {end}\n"


def with_config(repo: Path, text: str) -> None:
    (repo / ".xum").mkdir(exist_ok=True)
    (repo / ".xum" / "config.toml").write_text(text)
    git(repo, "add", ".xum")
    git(repo, "commit", "-q", "-m", "xum config")


def xum(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XUM_ROOT": str(daemon.root)}
    return subprocess.run([*XUM, *args], capture_output=True, text=True, env=env, timeout=60)


def started(root: Path, config: str) -> DaemonProcess:
    write_config(root, config)
    return DaemonProcess(root).start()


@contextmanager
def listening(port: int, address: str = "127.0.0.1") -> Iterator[socket.socket]:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        pytest.skip(f"no {address} socket here: {exc}")
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            pytest.skip(f"cannot listen on {address}: {exc}")
        sock.listen()
        yield sock
    finally:
        sock.close()


def port_rows(root: Path) -> dict[int, str]:
    db = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True)
    try:
        return dict(db.execute("SELECT port, workspace_id FROM workspace_ports").fetchall())
    finally:
        db.close()


def env_lines(text: str) -> list[str]:
    return sorted(
        line
        for line in text.splitlines()
        if line.startswith(("XUM_", "FOO=", "BAR=")) and not line.startswith("XUM_RUN")
    )


# -- the environment ----------------------------------------------------------------------------


def test_setup_teardown_and_a_process_get_the_same_environment(tmp_short: Path, repo: Path) -> None:
    start, end = port_range(20)
    with_config(
        repo,
        "[scripts]\n"
        'setup = ["env > setup.env"]\n'
        'teardown = ["env > \\"$XUM_ROOT/teardown.env\\""]\n'
        "[ports]\ncount = 2\n"
        '[env]\nFOO = "from-config"\nBAR = "config-bar"\n',
    )
    daemon = started(tmp_short / "root", ports_config(start, end))
    try:
        project = add_project(daemon, repo)
        daemon.call("project.trust", {"project_id": project["id"]})
        made = create(daemon, project["id"], "envy", env={"BAR": "from-request"})
        ws = made["workspace"]
        assert made["setup"]["status"] == "ok", made["setup"]
        assert len(ws["ports"]) == 2 and all(start <= p <= end for p in ws["ports"])
        assert ws["env"] == {"FOO": "from-config", "BAR": "from-request"}
        expected = sorted(
            [
                f"XUM_WORKSPACE_ID={ws['id']}",
                "XUM_WORKSPACE_NAME=envy",
                f"XUM_WORKSPACE_PATH={ws['path']}",
                f"XUM_PROJECT_PATH={project['path']}",
                "XUM_BRANCH=xum/envy",
                f"XUM_PORT={ws['ports'][0]}",
                f"XUM_PORTS={ws['ports'][0]},{ws['ports'][1]}",
                f"XUM_ROOT={daemon.root}",
                "FOO=from-config",
                "BAR=from-request",
            ]
        )
        in_setup = env_lines((Path(ws["path"]) / "setup.env").read_text())
        assert in_setup == expected
        # A real `xum run` process prints its environment: the same, plus its process id.
        run = xum(daemon, "run", ws["id"], "--", "env")
        assert run.returncode == 0, run.stderr
        in_run = [line for line in env_lines(run.stdout) if not line.startswith("XUM_PROCESS_ID=")]
        assert in_run == expected
        shown = xum(daemon, "ws", "show", ws["id"])
        assert f"ports: {ws['ports'][0]}, {ws['ports'][1]}" in shown.stdout
        assert "env: BAR FOO" in shown.stdout
        # Removal: the teardown runs after the row (and its ports and env) are gone, with the
        # variables as they were.
        removed = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
        assert removed["cleanup"]["status"] == "completed", removed["cleanup"]
        assert env_lines((daemon.root / "teardown.env").read_text()) == expected
        assert port_rows(daemon.root) == {}
    finally:
        daemon.close()


def test_neither_a_request_nor_the_daemon_environment_overrides_the_xum_variables(
    root: Path, repo: Path
) -> None:
    # A daemon started from inside a workspace inherits that workspace's XUM_* variables.
    inherited = {"XUM_BRANCH": "inherited", "XUM_PORT": "1", "XUM_WORKSPACE_PATH": "/elsewhere"}
    daemon = DaemonProcess(root, env=inherited).start()
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "p")["workspace"]
        run = xum(daemon, "run", ws["id"], "--env", "XUM_WORKSPACE_NAME=forged", "--", "env")
        assert run.returncode == 0, run.stderr
        assert "XUM_WORKSPACE_NAME=p\n" in run.stdout
        assert "XUM_BRANCH=xum/p\n" in run.stdout
        assert f"XUM_WORKSPACE_PATH={ws['path']}\n" in run.stdout
        assert "XUM_PORT=\n" in run.stdout and "XUM_PORTS=\n" in run.stdout
    finally:
        daemon.close()


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"XUM_PORT": "1"}, "reserved"),
        ({"xum_port": "1"}, "reserved"),
        ({"1BAD": "x"}, "not a valid variable name"),
        ({"A-B": "x"}, "not a valid variable name"),
        ({"BIG": "x" * (64 * 1024)}, "at most 65536"),
        ({f"V{i}": "" for i in range(300)}, "at most 256"),
    ],
)
def test_a_bad_env_is_refused_before_anything_is_made(
    daemon: DaemonProcess, repo: Path, env: dict[str, str], says: str
) -> None:
    project = add_project(daemon, repo)
    error = rpc_error(
        daemon, "workspace.create", {"project_id": project["id"], "name": "bad", "env": env}
    )
    assert error.kind == "invalid_params"
    assert says in str(error.data["errors"])
    assert daemon.call("workspace.list")["workspaces"] == []


def test_a_project_env_with_a_reserved_name_refuses_the_create(
    daemon: DaemonProcess, repo: Path
) -> None:
    with_config(repo, '[env]\nXUM_ROOT = "/elsewhere"\n')
    project = add_project(daemon, repo)
    error = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "x"})
    assert error.kind == "invalid_params"
    assert "config.toml" in str(error) and "reserved" in str(error)
    assert daemon.call("workspace.list")["workspaces"] == []
    assert len(worktrees(repo)) == 1


# -- ports --------------------------------------------------------------------------------------


def test_concurrent_creates_get_distinct_ports(tmp_short: Path, repo: Path) -> None:
    start, end = port_range(40)
    daemon = started(tmp_short / "root", ports_config(start, end, count=3))
    try:
        project = add_project(daemon, repo)
        results: dict[str, Any] = {}
        errors: list[BaseException] = []

        def make(name: str) -> None:
            try:
                with daemon.client(timeout=120) as client:
                    results[name] = client.call(
                        "workspace.create", {"project_id": project["id"], "name": name}
                    )
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=make, args=(f"c{i}",)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
        assert not errors, errors
        every = [p for r in results.values() for p in r["workspace"]["ports"]]
        assert len(every) == 18 and len(set(every)) == 18
        assert all(start <= p <= end for p in every)
        assert sorted(port_rows(daemon.root)) == sorted(every)
    finally:
        daemon.close()


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "0.0.0.0"])
def test_a_port_something_listens_on_is_skipped(tmp_short: Path, repo: Path, address: str) -> None:
    start, end = port_range(3)
    daemon = started(tmp_short / "root", ports_config(start, end, count=1))
    try:
        project = add_project(daemon, repo)
        with listening(start, address):
            ws = create(daemon, project["id"], "l")["workspace"]
        assert ws["ports"] == [start + 1]
    finally:
        daemon.close()


def test_an_exhausted_range_is_a_clear_error_and_nothing_is_made(
    tmp_short: Path, repo: Path
) -> None:
    start, end = port_range(2)
    daemon = started(tmp_short / "root", ports_config(start, end, count=2))
    try:
        project = add_project(daemon, repo)
        first = create(daemon, project["id"], "a")["workspace"]
        assert first["ports"] == [start, end]
        error = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "b"})
        assert error.kind == "ports_exhausted"
        assert error.data["needed"] == 2 and error.data["range"] == [start, end]
        assert [w["name"] for w in daemon.call("workspace.list")["workspaces"]] == ["a"]
        assert not (Path(first["path"]).parent / "b").exists()
        # Released on removal: the next create gets them.
        daemon.call("workspace.remove", {"workspace_id": first["id"]})
        assert port_rows(daemon.root) == {}
        assert create(daemon, project["id"], "b")["workspace"]["ports"] == [start, end]
    finally:
        daemon.close()


def test_ports_are_kept_while_archived_and_replaced_only_when_taken(
    tmp_short: Path, repo: Path
) -> None:
    start, end = port_range(10)
    daemon = started(tmp_short / "root", ports_config(start, end, count=2))
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "k")["workspace"]
        held = ws["ports"]
        daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        archived = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
        assert archived["state"] == "archived" and archived["ports"] == held
        other = create(daemon, project["id"], "o")["workspace"]
        assert not set(other["ports"]) & set(held)
        back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
        assert back["workspace"]["ports"] == held and back["ports_replaced"] == []
        # Taken meanwhile by something else: replaced, and said so.
        daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        with listening(held[1]):
            again = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
        ports = again["workspace"]["ports"]
        assert ports[0] == held[0] and ports[1] != held[1]
        assert again["ports_replaced"] == [{"old": held[1], "new": ports[1]}]
        assert ports[1] not in other["ports"]
    finally:
        daemon.close()


def test_a_crash_between_allocation_and_checkout_neither_leaks_nor_doubles(
    tmp_short: Path, repo: Path
) -> None:
    start, end = port_range(4)
    root = tmp_short / "root"
    write_config(root, ports_config(start, end, count=2))
    daemon = DaemonProcess(root, env={"XUM_FAULT": "workspace.create.after_intent"}).start()
    project = add_project(daemon, repo)
    with pytest.raises(Exception):  # noqa: B017 - the daemon dies mid-call
        create(daemon, project["id"], "crash")
    assert daemon.wait() == -9
    daemon = DaemonProcess(root).start()
    try:
        (flagged,) = daemon.call("workspace.list")["workspaces"]
        assert flagged["interrupted"] and flagged["ports"] == [start, start + 1]
        assert port_rows(root) == {start: flagged["id"], start + 1: flagged["id"]}
        fresh = create(daemon, project["id"], "next")["workspace"]
        assert fresh["ports"] == [start + 2, end]
        # Resolving the interrupted one releases its ports with its row.
        daemon.call("workspace.remove", {"workspace_id": flagged["id"]})
        assert sorted(port_rows(root)) == [start + 2, end]
        daemon.call("workspace.remove", {"workspace_id": fresh["id"]})
        assert create(daemon, project["id"], "last")["workspace"]["ports"] == [start, start + 1]
    finally:
        daemon.close()


def test_the_cli_passes_env_and_shows_ports(tmp_short: Path, repo: Path) -> None:
    start, end = port_range(5)
    daemon = started(tmp_short / "root", ports_config(start, end, count=1))
    try:
        project = add_project(daemon, repo)
        done = xum(daemon, "ws", "new", project["name"], "cli", "--env", "FOO=a=b", "--env", "BAR=")
        assert done.returncode == 0, done.stderr
        assert f"ports: {start} (XUM_PORT={start})" in done.stdout
        ws = daemon.call("workspace.list")["workspaces"][0]
        assert ws["env"] == {"FOO": "a=b", "BAR": ""}
        bad = xum(daemon, "ws", "new", project["name"], "cli2", "--env", "NOEQUALS")
        assert bad.returncode == 2 and "NAME=VALUE" in bad.stderr
        reserved = xum(daemon, "ws", "new", project["name"], "cli3", "--env", "XUM_PORT=1")
        assert reserved.returncode == 2 and "cannot be overridden" in reserved.stderr
        assert len(daemon.call("workspace.list")["workspaces"]) == 1
    finally:
        daemon.close()


def test_an_unarchive_with_no_port_to_replace_a_taken_one_changes_nothing(
    tmp_short: Path, repo: Path
) -> None:
    start, end = port_range(2)
    daemon = started(tmp_short / "root", ports_config(start, end, count=1))
    try:
        project = add_project(daemon, repo)
        a = create(daemon, project["id"], "a")["workspace"]
        b = create(daemon, project["id"], "b")["workspace"]
        assert (a["ports"], b["ports"]) == ([start], [end])
        daemon.call("workspace.archive", {"workspace_id": a["id"]})
        with listening(start):
            error = rpc_error(daemon, "workspace.unarchive", {"workspace_id": a["id"]})
        assert error.kind == "ports_exhausted"
        still = daemon.call("workspace.get", {"workspace_id": a["id"]})["workspace"]
        assert still["state"] == "archived" and still["ports"] == [start]
        assert not Path(a["path"]).exists()
        back = daemon.call("workspace.unarchive", {"workspace_id": a["id"]})
        assert back["workspace"]["ports"] == [start] and back["ports_replaced"] == []
    finally:
        daemon.close()


def test_an_unarchive_under_a_broken_project_config_changes_nothing(
    daemon: DaemonProcess, repo: Path
) -> None:
    project = add_project(daemon, repo)
    ws = create(daemon, project["id"], "u")["workspace"]
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    (repo / ".xum").mkdir(exist_ok=True)
    (repo / ".xum" / "config.toml").write_text("[ports]\ncount = -1\n")
    error = rpc_error(daemon, "workspace.unarchive", {"workspace_id": ws["id"]})
    assert error.kind == "invalid_params" and "[ports] count" in str(error)
    still = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert still["state"] == "archived" and not Path(ws["path"]).exists()


def test_a_request_env_and_a_project_env_over_the_limit_together_are_refused(
    daemon: DaemonProcess, repo: Path
) -> None:
    """Each is within the limits alone; merged (what is stored and given to every child) they
    are not: refused before anything is made, not stored over the limit."""
    with_config(repo, "[env]\n" + "".join(f'P{i} = ""\n' for i in range(200)))
    project = add_project(daemon, repo)
    env = {f"R{i}": "" for i in range(100)}
    error = rpc_error(
        daemon, "workspace.create", {"project_id": project["id"], "name": "e", "env": env}
    )
    assert error.kind == "invalid_params"
    assert "at most 256" in str(error)
    assert daemon.call("workspace.list")["workspaces"] == []
    assert len(worktrees(repo)) == 1
