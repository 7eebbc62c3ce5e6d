"""File descriptors: the daemon raises its soft limit, caps connections below it, keeps a reserve
for its own work, and keeps serving when accept fails with EMFILE.

Real parts: a real xumd started under `prlimit` (the hard limit lowered, so it cannot raise past
it), real Unix socket connections past the limit, real git for create and archive."""

from __future__ import annotations

import json
import resource
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from xum_client.errors import Busy

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import make_repo
from tests.support.wait import until

PRLIMIT = shutil.which("prlimit")
needs_prlimit = pytest.mark.skipif(PRLIMIT is None, reason="prlimit (util-linux) is not installed")


def _limited_daemon(root: Path, nofile: int, config: str = "") -> DaemonProcess:
    assert PRLIMIT is not None
    write_config(root, config)
    return DaemonProcess(
        root, launcher=[PRLIMIT, f"--nofile={nofile}:{nofile}", "--"], log_level="info"
    )


def _connect_many(path: Path, count: int, stack: ExitStack) -> list[socket.socket]:
    socks: list[socket.socket] = []
    for _ in range(count):
        sock = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        sock.settimeout(10)
        sock.connect(str(path))
        socks.append(sock)
    return socks


def _refusal(sock: socket.socket) -> dict[str, Any] | None:
    """The one error frame a refused connection gets (then EOF), or None if it is served."""
    sock.settimeout(0.05)
    try:
        data = sock.recv(4096)
    except TimeoutError:
        return None  # accepted and waiting for a request: served
    finally:
        sock.settimeout(10)
    if not data:
        return {"eof": True}
    frame: dict[str, Any] = json.loads(data.split(b"\n")[0])
    return frame


def _fds(daemon: DaemonProcess, client: Any) -> dict[str, Any]:
    details: dict[str, Any] = client.call("daemon.status")["details"]
    return dict(details["fds"])


def _status_or_none(daemon: DaemonProcess) -> dict[str, Any] | None:
    try:
        return daemon.call("daemon.status")
    except Busy:
        return None  # the closed connections are not all seen yet


@pytest.fixture
def limited(tmp_short: Path) -> Iterator[tuple[DaemonProcess, Path]]:
    daemon = _limited_daemon(tmp_short / "root", 256)
    try:
        yield daemon.start(), tmp_short
    finally:
        daemon.close()


def test_soft_limit_raised_to_hard_and_reported(daemon: DaemonProcess) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with daemon.client() as client:
        fds = _fds(daemon, client)
    expected = min(hard, 1 << 20) if hard != resource.RLIM_INFINITY else 1 << 20
    assert fds["hard"] == expected
    assert fds["soft"] == expected  # raised from the inherited soft limit
    assert fds["initial_soft"] == soft
    assert 0 < fds["max_connections"] <= fds["soft"] - fds["reserve"]
    limits = Path(f"/proc/{daemon.pid}/limits").read_text()
    line = next(row for row in limits.splitlines() if row.startswith("Max open files"))
    assert line.split()[3] == str(expected)


@needs_prlimit
def test_connections_past_the_limit_are_refused_and_work_goes_on(
    limited: tuple[DaemonProcess, Path],
) -> None:
    daemon, tmp = limited
    repo = make_repo(tmp / "repo")
    with daemon.client() as first, ExitStack() as stack:
        fds = _fds(daemon, first)
        assert fds["soft"] == fds["hard"] == 256
        cap = fds["max_connections"]
        assert cap < 256
        project = first.call("project.add", {"path": str(repo)})["project"]
        # Past the descriptor limit itself, not only past the cap.
        socks = _connect_many(daemon.socket_path, 300, stack)
        verdicts = [until(lambda s=s: _refusal(s) or "served", 10) for s in socks]
        refused = [v for v in verdicts if v != "served"]
        served = len(verdicts) - len(refused)
        # `first` holds one connection: the cap counts it.
        assert served == cap - 1
        for frame in refused:
            assert isinstance(frame, dict)
            assert frame["error"]["data"]["kind"] == "busy"
            assert frame["error"]["data"]["resource"] in ("connections", "file_descriptors")
        # The daemon's own work still has its descriptors: git spawns, the store, snapshots.
        made = first.call("workspace.create", {"project_id": project["id"], "name": "under-load"})
        assert made["workspace"]["state"] == "active"
        (Path(made["workspace"]["path"]) / "work.txt").write_text("unsaved\n")
        archived = first.call("workspace.archive", {"workspace_id": made["workspace"]["id"]})
        assert archived["workspace"]["state"] == "archived"
        assert archived["cleanup"]["status"] == "completed"
        assert _fds(daemon, first)["refused_connections"] >= len(refused)
    # Every refused or closed client's descriptor is given back: new clients are served.
    # Each probe is a new client: it is served, and sees the descriptors given back, only once
    # the daemon has seen the closes (a slot freed by one close may be taken by the probe).
    until(
        lambda: (
            (status := _status_or_none(daemon)) is not None
            and status["details"]["fds"]["open"] < 100
        ),
        10,
        message="a new client served, the descriptors given back",
    )
    assert daemon.proc is not None and daemon.proc.poll() is None


# A listener in its own process with a descriptor limit, whose reserve some other work (here:
# descriptors opened on /dev/null, as git pipes or PTYs would be) has used up. The cap cannot
# prevent EMFILE then: accept itself fails. The hog is given back on a line on stdin.
_EMFILE_SERVER = r"""
import os, sys, anyio
from xumd.base import logs
logs.configure("info", json=True)
from xum_protocol.models.daemon import DAEMON_SHUTDOWN
from xum_protocol.models.daemon import ShutdownResult
from xumd.base.config import DaemonConfig
from xumd.system.fdlimits import plan
from xumd.system.procutil import run_command
from xumd.rpc.dispatch import Router
from xumd.rpc.server import Server, bind_socket
from pathlib import Path

router = Router()

async def spawn(params, ctx):
    # A handler whose work needs descriptors (pipes for a child), as git's does.
    await run_command(["true"], timeout_s=10)
    return ShutdownResult(stopping=False)

router.add(DAEMON_SHUTDOWN, spawn)

async def main():
    server = Server(router, DaemonConfig())
    server.attach(bind_socket(Path(sys.argv[1])))
    server.limits = plan(1000, 16)
    hog = []
    async with anyio.create_task_group() as conns, anyio.create_task_group() as work:
        conns.start_soon(server.serve, conns, work)
        print("LISTENING", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        # The reserve is used by other work, up to the last descriptor (the spare excepted).
        while True:
            try:
                hog.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        print("READY", len(hog), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        for fd in hog:
            os.close(fd)
        print("FREED", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        print("FAILURES", server.limits.accept_failures, server.limits.refused, flush=True)
        conns.cancel_scope.cancel()

anyio.run(main)
"""


@needs_prlimit
def test_accept_out_of_descriptors_backs_off_and_recovers(tmp_short: Path) -> None:
    assert PRLIMIT is not None
    path = tmp_short / "s"
    proc = subprocess.Popen(
        [PRLIMIT, "--nofile=64:64", "--", sys.executable, "-c", _EMFILE_SERVER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().startswith("LISTENING")
        early = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        early.settimeout(10)
        early.connect(str(path))
        early.sendall(b'{"jsonrpc":"2.0","id":0,"method":"nope"}\n')
        early_in = early.makefile("rb")
        assert json.loads(early_in.readline())["id"] == 0  # accepted and served
        proc.stdin.write("hog\n")
        proc.stdin.flush()
        assert proc.stdout.readline().startswith("READY")
        # Work that needs a descriptor fails with a clear error naming the resource.
        early.sendall(b'{"jsonrpc":"2.0","id":1,"method":"daemon.shutdown"}\n')
        failed = json.loads(early_in.readline())
        assert failed["error"]["data"] == {
            "kind": "operation_failed",
            "resource": "file_descriptors",
        }
        assert "out of file descriptors" in failed["error"]["message"]
        with ExitStack() as stack:
            socks = _connect_many(path, 5, stack)
            refusals = [until(lambda s=s: _refusal(s), 10) for s in socks[:1]]
            # The newest client is told why (the spare descriptor), not left hanging.
            assert refusals[0]["error"]["data"] == {
                "kind": "busy",
                "resource": "file_descriptors",
            }
            assert proc.poll() is None  # the listener lives through EMFILE
        proc.stdin.write("free\n")
        proc.stdin.flush()
        assert proc.stdout.readline().startswith("FREED")
        # Recovered: a new client is accepted and answered (no route: method_not_found).
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(path))
            sock.sendall(b'{"jsonrpc":"2.0","id":1,"method":"nope"}\n')
            answer = json.loads(sock.makefile("rb").readline())
            assert answer["id"] == 1 and answer["error"]["data"]["kind"] == "method_not_found"
        # ...and the work that failed for want of a descriptor succeeds now.
        early.sendall(b'{"jsonrpc":"2.0","id":2,"method":"daemon.shutdown"}\n')
        assert json.loads(early_in.readline())["result"] == {"stopping": False}
        early_in.close()
        early.close()
        proc.stdin.write("report\n")
        proc.stdin.flush()
        _, failures, refused = proc.stdout.readline().split()
        assert int(failures) >= 1 and int(refused) >= 1
        proc.stdin.close()
        assert proc.wait(10) == 0
        stderr = proc.stderr.read() if proc.stderr else ""
        # Logged once per episode, not at every retry of the backlog.
        assert stderr.count("server.accept_failed") <= 2, stderr[-2000:]
        assert "Traceback" not in stderr, stderr[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
