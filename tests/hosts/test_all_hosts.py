"""One view across hosts (`--all-hosts`, `xum_client.allhosts`) against a real OpenSSH server.

Two hosts, `h1` and `h2`, are two roots behind two host entries, both reached through the same
loopback sshd (the bridge on the far side connects to the daemon of its `--remote-root`); the
local daemon is a third root. Their daemons are started here directly (the bridge finds them
running), so each test knows their pids. `down` is a port nothing listens on; `hang` is a port
that accepts and then never says anything (a host that does not answer).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from xum_client import allhosts
from xum_client.allhosts import HostEvents, Target
from xum_client.hosts import HostEntry, add_host

from tests.support.daemon import DaemonProcess, short_tmpdir
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project, create
from tests.support.sshd import ALIAS, ALIAS_DOWN, SshServer
from tests.support.wait import until

XUM = str(Path(sys.executable).parent / "xum")


class SilentPort:
    """A TCP port that accepts connections and never writes a byte (ssh waits for a banner)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


class World:
    """One sshd and three daemons for the whole module; each test has its own hosts file."""

    def __init__(self, base: Path) -> None:
        self.base = base
        (base / "sshd").mkdir()
        self.server = SshServer(base / "sshd").start()
        self.silent = SilentPort()
        with open(self.server.ssh_config, "a") as config:
            config.write(
                f"\nHost xumtest-hang\n  HostName 127.0.0.1\n  Port {self.silent.port}\n"
                "  User nobody\n  UserKnownHostsFile /dev/null\n  StrictHostKeyChecking no\n"
            )
        self.local = DaemonProcess(base / "local").start()
        self.h1 = DaemonProcess(base / "r1").start()
        self.h2 = DaemonProcess(base / "r2").start()
        self.env: dict[str, str] = {}
        self.tests = 0

    def fresh_hosts(self) -> None:
        """A new hosts file with h1 and h2 (their roots behind the same sshd)."""
        self.tests += 1
        hosts_file = self.base / f"hosts-{self.tests}.toml"
        self.env = {**self.server.env(), "XUM_HOSTS_FILE": str(hosts_file)}
        add_host(HostEntry("h1", ALIAS, str(self.h1.root)), path=hosts_file)
        add_host(HostEntry("h2", ALIAS, str(self.h2.root)), path=hosts_file)

    def xum(
        self, *args: str, check: bool = True, root: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [XUM, "--root", str(root or self.local.root), *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **self.env},
        )
        if check:
            assert done.returncode == 0, done.stderr
        return done

    def spawn(self, *args: str) -> subprocess.Popen[str]:
        """`xum --root LOCAL ARGS` running (a long view the test reads as it goes)."""
        return subprocess.Popen(
            [XUM, "--root", str(self.local.root), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **self.env},
        )

    def close(self) -> None:
        for daemon in (self.local, self.h1, self.h2):
            daemon.close()
        self.silent.close()
        self.server.close()


@pytest.fixture(scope="module")
def shared_world() -> Iterator[World]:
    base = short_tmpdir("xumah-")
    w: World | None = None
    try:
        w = World(base)
        yield w
    finally:
        if w is not None:
            w.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def world(shared_world: World) -> World:
    shared_world.fresh_hosts()
    return shared_world


@pytest.fixture
def in_process_env(world: World, monkeypatch: pytest.MonkeyPatch) -> World:
    """The same hosts for the Python client in this process."""
    for key, value in world.env.items():
        monkeypatch.setenv(key, value)
    return world


def one_workspace_each(world: World) -> dict[str | None, dict[str, Any]]:
    """One workspace on each daemon (once per module: the daemons are shared)."""
    made: dict[str | None, dict[str, Any]] = {}
    for host, daemon in ((None, world.local), ("h1", world.h1), ("h2", world.h2)):
        listed = daemon.call("workspace.list", {})["workspaces"]
        if listed:
            made[host] = listed[0]
            continue
        repo = make_repo(daemon.root.parent / f"repo-{host or 'local'}")
        project = add_project(daemon, repo)
        made[host] = create(daemon, project["id"], f"ws-{host or 'local'}")["workspace"]
    return made


def test_ws_ls_all_hosts_lists_each_host_and_reports_one_down(world: World) -> None:
    made = one_workspace_each(world)
    world.xum("host", "add", "down", ALIAS_DOWN)
    done = world.xum("ws", "ls", "--all-hosts", "--json")
    data = json.loads(done.stdout)
    got = {(w["host"], w["id"]) for w in data["workspaces"]}
    assert got == {(host, w["id"]) for host, w in made.items()}
    hosts = {h["host"]: h for h in data["hosts"]}
    assert list(hosts) == [None, "down", "h1", "h2"]
    assert hosts[None]["ok"] and hosts[None]["count"] == 1
    assert hosts["h1"]["ok"] and hosts["h1"]["count"] == 1
    assert hosts["down"]["ok"] is False
    assert hosts["down"]["error"]["kind"] == "host_unreachable"
    assert "Connection refused" in hosts["down"]["error"]["message"]

    human = world.xum("ws", "ls", "--all-hosts").stdout.splitlines()
    assert any(line.startswith("local ") and "ws-local" in line for line in human)
    assert any(line.startswith("h1 ") and "ws-h1" in line for line in human)
    assert any(line.startswith("h2 ") and "ws-h2" in line for line in human)
    down = [line for line in human if line.startswith("down ")]
    assert len(down) == 1 and "host_unreachable" in down[0]


def test_status_all_hosts_names_each_daemon(world: World) -> None:
    data = json.loads(world.xum("status", "--all-hosts", "--json").stdout)
    pids = {h["host"]: h["status"]["pid"] for h in data["hosts"]}
    assert pids == {None: world.local.pid, "h1": world.h1.pid, "h2": world.h2.pid}
    roots = {h["host"]: h["status"]["root"] for h in data["hosts"]}
    assert roots["h2"] == str(world.h2.root)
    # The human table: one row per target, qualified by its host.
    rows = world.xum("status", "--all-hosts").stdout.splitlines()
    assert rows[0].split() == ["host", "daemon", "pid", "root", "uptime", "state"]
    by_host = {row.split()[0]: row.split() for row in rows[1:]}
    # (the daemon column is two words: `xumd 0.1.0`)
    assert by_host["h1"][3] == str(world.h1.pid) and by_host["h1"][4] == str(world.h1.root)
    assert by_host["local"][3] == str(world.local.pid) and by_host["h2"][-1] == "serving"


def test_no_target_answering_is_exit_1(world: World) -> None:
    # No daemon on this local root; the hosts' bridges cannot make theirs (a root under /proc).
    world.xum("host", "add", "h1", ALIAS, "--remote-root", "/proc/nope/r1", "--replace")
    world.xum("host", "add", "h2", ALIAS, "--remote-root", "/proc/nope/r2", "--replace")
    done = world.xum("status", "--all-hosts", "--json", check=False, root=world.base / "none")
    assert done.returncode == 1
    kinds = {h["host"]: h["error"]["kind"] for h in json.loads(done.stdout)["hosts"]}
    assert kinds[None] == "no_daemon"
    assert set(kinds) == {None, "h1", "h2"}


def test_a_host_that_never_answers_is_cut_at_its_deadline_and_hosts_go_at_once(
    world: World,
) -> None:
    world.xum("host", "add", "hang", "xumtest-hang")
    world.xum("host", "add", "hang2", "xumtest-hang")
    before = len(world.silent.accepted)
    proc = world.spawn("status", "--all-hosts", "--json", "--host-timeout", "60")
    try:
        # Both silent hosts are being asked at the same time: one at a time, the second
        # connection would come only after the first one's 60 s.
        until(lambda: len(world.silent.accepted) >= before + 2, timeout=30, message="both connect")
    finally:
        proc.kill()
        proc.wait()
    done = world.xum("status", "--all-hosts", "--json", "--host-timeout", "1")
    hosts = {h["host"]: h for h in json.loads(done.stdout)["hosts"]}
    assert hosts["hang"]["ok"] is False and hosts["hang2"]["ok"] is False
    assert hosts["hang"]["error"]["kind"] == "client_timeout"
    # (h1 and h2 may or may not make it in 1 s on a loaded machine: not asserted here.)
    assert hosts[None]["ok"]
    # The ssh of a host that timed out was stopped with its client: none outlives the CLI.
    mine = psutil.Process()
    leftovers = [
        p for p in mine.children(recursive=True) if "xumtest-hang" in " ".join(p.cmdline())
    ]
    assert leftovers == []


def test_gather_in_process_reports_each_target(in_process_env: World) -> None:
    world = in_process_env
    answers = allhosts.gather(
        lambda c: c.call("daemon.status")["pid"],
        allhosts.targets(str(world.local.root)),
    )
    assert [(a.target.host, a.result) for a in answers] == [
        (None, world.local.pid),
        ("h1", world.h1.pid),
        ("h2", world.h2.pid),
    ]


def _ssh_for(alias_root: Path) -> list[psutil.Process]:
    """This test's ssh processes that carry `alias_root` in their command (its host's)."""
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if p.name() == "ssh" and str(alias_root) in " ".join(p.cmdline())
    ]


def test_events_from_several_hosts_tagged_and_resumed_after_a_drop(
    in_process_env: World,
) -> None:
    world = in_process_env
    where = [Target(None, str(world.local.root)), Target("h1")]
    repo_local = make_repo(world.base / "ev-local")
    repo_h1 = make_repo(world.base / "ev-h1")
    with HostEvents(where, ["project."], deadline_s=30, max_backoff_s=0.5) as stream:
        subscribed = set()
        while len(subscribed) < 2:
            item = stream.next(timeout=60)
            assert item.kind == "subscribed", item
            subscribed.add(item.host)
        add_project(world.local, repo_local)
        add_project(world.h1, repo_h1)
        seen: dict[str | None, list[dict[str, Any]]] = {None: [], "h1": []}
        while not (seen[None] and seen["h1"]):
            item = stream.next(timeout=60)
            if item.kind == "event":
                seen[item.host].append(item.data)
        assert seen["h1"][0]["data"]["project"]["path"] == str(repo_h1)
        assert seen[None][0]["data"]["project"]["path"] == str(repo_local)
        last_h1 = seen["h1"][-1]["seq"]

        # Cut h1's ssh: the stream says so, reconnects, and replays what happened meanwhile.
        (ssh,) = _ssh_for(world.h1.root)
        ssh.send_signal(signal.SIGKILL)
        lost = stream.next(timeout=60)
        assert (lost.host, lost.kind) == ("h1", "lost")
        repo_h1b = make_repo(world.base / "ev-h1b")
        add_project(world.h1, repo_h1b)
        while True:
            item = stream.next(timeout=60)
            if item.host == "h1" and item.kind == "event":
                break
        assert item.data["seq"] > last_h1
        assert item.data["data"]["project"]["path"] == str(repo_h1b)
    # Closed: no ssh left behind.
    until(lambda: not _ssh_for(world.h1.root), timeout=20, message="ssh gone")


# The real CLI, its client claiming another release (one constant changed before it runs).
CLAIMING = (
    "import sys, xum_client.sync as s; s.CLIENT_VERSION = sys.argv[1]; "
    "from xum_client.cli import main; main(sys.argv[2:])"
)


def test_a_host_of_another_version_is_named_with_how_to_fix_it(world: World) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CLAIMING, "0.99.0", "--host", "h1", "status"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **world.env},
    )
    assert done.returncode == 1
    line = done.stderr.strip().splitlines()[-1]
    assert f"the daemon on host h1 ({world.h1.root}) is xumd " in line
    assert "xum 0.99.0" in line and "xum host install h1" in line
    # In the one view, each such host is a row saying so; none answered: exit 1.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            CLAIMING,
            "0.99.0",
            "--root",
            str(world.local.root),
            "status",
            "--all-hosts",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **world.env},
    )
    assert done.returncode == 1
    kinds = {h["host"]: h["error"]["kind"] for h in json.loads(done.stdout)["hosts"]}
    assert kinds == {None: "version_mismatch", "h1": "version_mismatch", "h2": "version_mismatch"}


def test_xum_events_all_hosts_tags_each_line(world: World) -> None:
    proc = world.spawn("events", "--all-hosts", "--json", "--type", "project.", "--count", "1")
    try:
        assert proc.stdout is not None
        subscribed = set()
        while len(subscribed) < 3:
            item = json.loads(proc.stdout.readline())
            assert item["kind"] == "subscribed", item
            subscribed.add(item["host"])
        assert subscribed == {None, "h1", "h2"}
        repo = make_repo(world.base / "ev-cli-h2")
        add_project(world.h2, repo)
        item = json.loads(proc.stdout.readline())
        assert (item["host"], item["kind"]) == ("h2", "event")
        assert item["data"]["type"] == "project.added"
        assert item["data"]["data"]["project"]["path"] == str(repo)
        assert proc.wait(timeout=60) == 0  # --count 1: done
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
