"""`xum bridge`: stdin/stdout relayed to the daemon's socket, the daemon started when none runs
(docs/HOSTS.md). Local pipes here; through a real sshd in tests/hosts/test_ssh.py."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import psutil

from tests.support.daemon import DaemonProcess, write_config
from tests.support.lockholder import read_holder
from tests.support.sshd import stop_root_daemon
from tests.support.wait import until

XUM = str(Path(sys.executable).parent / "xum")


def bridge(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [XUM, "bridge", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def send(stream: IO[bytes] | None, request_id: int, method: str, **params: Any) -> None:
    assert stream is not None
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params:
        message["params"] = params
    stream.write(json.dumps(message).encode() + b"\n")
    stream.flush()


def answer(stream: IO[bytes] | None) -> dict[str, Any]:
    assert stream is not None
    line = stream.readline()
    assert line, "the bridge ended its output"
    reply: dict[str, Any] = json.loads(line)
    return reply


def hello(proc: subprocess.Popen[bytes], request_id: int = 1) -> dict[str, Any]:
    send(proc.stdin, request_id, "hello", protocol="1.0", client={"name": "t", "version": "0"})
    reply = answer(proc.stdout)
    assert reply["id"] == request_id, reply
    result: dict[str, Any] = reply["result"]
    return result


def test_bridge_relays_and_half_closes(daemon: DaemonProcess) -> None:
    proc = bridge("--root", str(daemon.root))
    try:
        assert hello(proc)["pid"] == daemon.pid
        # Two requests in one write, then stdin ends: both answered, in order, then the bridge
        # ends (the daemon ends a half-closed connection once its answers are written).
        assert proc.stdin is not None
        proc.stdin.write(
            b'{"jsonrpc":"2.0","id":2,"method":"daemon.status"}\n'
            b'{"jsonrpc":"2.0","id":3,"method":"no.such"}\n'
        )
        proc.stdin.close()
        assert answer(proc.stdout)["result"]["pid"] == daemon.pid
        assert answer(proc.stdout)["error"]["data"]["kind"] == "method_not_found"
        assert proc.wait(20) == 0
        assert proc.stdout is not None and proc.stdout.read() == b""
    finally:
        proc.kill()
        proc.wait()


def test_bridge_starts_a_detached_daemon(tmp_short: Path) -> None:
    root = tmp_short / "root"
    session = {
        "SSH_AUTH_SOCK": str(tmp_short / "agent.sock"),
        "SSH_CONNECTION": "127.0.0.1 5555 127.0.0.1 22",
        "SSH_CLIENT": "127.0.0.1 5555 22",
        "XUM_BRIDGE_TEST_KEEP": "kept",
    }
    # A relative root, from the session's directory: the daemon gets it absolute.
    proc = bridge("--root", "root", env=session, cwd=tmp_short)
    try:
        info = hello(proc)
        assert info["root"] == str(root)
        daemon_pid = info["pid"]
        started = psutil.Process(daemon_pid)
        # It runs from /, without the ssh session's variables (a forwarded agent's socket is a
        # credential, gone with the session), with the rest of the environment.
        assert started.cwd() == "/"
        environ = started.environ()
        assert not {"SSH_AUTH_SOCK", "SSH_CONNECTION", "SSH_CLIENT"} & set(environ)
        assert environ["XUM_BRIDGE_TEST_KEEP"] == "kept"
        # Its own session (an ssh session's hangup never reaches it), stdio into the root's log.
        assert os.getsid(daemon_pid) == daemon_pid
        assert os.getsid(daemon_pid) != os.getsid(proc.pid)
        log = root / "xumd.log"
        assert (log.stat().st_mode & 0o777) == 0o600
        assert os.path.realpath(f"/proc/{daemon_pid}/fd/2") == str(log)
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(20) == 0
        # The bridge is gone; the daemon it started serves on.
        assert started.is_running()
        holder = read_holder(root / "xumd.lock")
        assert holder is not None and holder["pid"] == daemon_pid
        again = bridge("--root", str(root))
        try:
            assert hello(again)["pid"] == daemon_pid
        finally:
            again.kill()
            again.wait()
    finally:
        proc.kill()
        proc.wait()
        stop_root_daemon(root)


def test_two_bridges_racing_start_one_daemon(tmp_short: Path) -> None:
    """Bridges that find no daemon at the same moment each start one: the root lock keeps one,
    the others exit 3 and their bridges connect to the winner."""
    root = tmp_short / "root"
    procs = [bridge("--root", str(root)) for _ in range(3)]
    try:
        pids = {hello(p)["pid"] for p in procs}
        assert len(pids) == 1
        holder = read_holder(root / "xumd.lock")
        assert holder is not None and pids == {holder["pid"]}

        def live_xumds() -> list[int]:
            found = []
            for p in psutil.process_iter(["cmdline", "status"]):
                argv = p.info["cmdline"] or []
                if "xumd" in argv and str(root) in argv and p.info["status"] != "zombie":
                    found.append(p.pid)
            return found

        # The losers (if this run raced) exit 3 and are reaped by their bridges.
        until(lambda: live_xumds() == list(pids), message="one xumd left on the root")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        stop_root_daemon(root)


def test_bridge_waits_for_the_daemon_that_holds_the_root(tmp_short: Path) -> None:
    """The race made an ordered step: another daemon holds the root lock (here: the test) when
    the bridge starts its own, which exits 3; the bridge waits on, and connects to the lock
    holder once that one listens."""
    root = tmp_short / "root"
    root.mkdir(mode=0o700)
    lock = os.open(root / "xumd.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    proc = bridge("--root", str(root))
    daemon = DaemonProcess(root)
    try:
        log = root / "xumd.log"
        until(
            lambda: log.exists() and "already running" in log.read_text(errors="replace"),
            message="the bridge's xumd to find the root taken",
        )
        assert proc.poll() is None
        os.close(lock)
        daemon.start()
        assert hello(proc)["pid"] == daemon.pid
    finally:
        proc.kill()
        proc.wait()
        daemon.close()


def test_bridge_reports_a_daemon_that_cannot_start(tmp_short: Path) -> None:
    root = tmp_short / "root"
    write_config(root, "this is = not [toml\n")
    proc = bridge("--root", str(root))
    try:
        assert proc.stdin is not None
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1
    text = err.decode()
    assert text.startswith("xum bridge: xumd exited with status 4 before accepting on ")
    assert "config.toml" in text and f"log: {root / 'xumd.log'}" in text
    assert text.count("\n") == 1


def test_bridge_refuses_a_root_it_cannot_make(tmp_short: Path) -> None:
    (tmp_short / "file").write_text("")
    proc = bridge("--root", str(tmp_short / "file" / "root"))
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert err.decode().startswith("xum bridge: cannot prepare root ")
    assert err.decode().count("\n") == 1


def test_bridge_ends_when_its_reader_goes_away(daemon: DaemonProcess) -> None:
    """A subscriber's bridge whose stdout reader is gone (ssh dropped) ends at once, and the
    daemon sees the connection close, without waiting for an event to fail to be written."""
    proc = bridge("--root", str(daemon.root))
    try:
        hello(proc)
        send(proc.stdin, 2, "events.subscribe")
        assert answer(proc.stdout)["id"] == 2
        assert daemon.call("daemon.status")["connections"] == 2  # the bridge's and this one
        assert proc.stdout is not None
        proc.stdout.close()
        assert proc.wait(20) == 0
        until(
            lambda: daemon.call("daemon.status")["connections"] == 1,
            message="the daemon saw the bridge's connection close",
        )
    finally:
        proc.kill()
        proc.wait()


def test_bridge_ignores_xum_host(daemon: DaemonProcess, tmp_short: Path) -> None:
    """On the host, an exported XUM_HOST must not send the bridge through ssh again."""
    proc = subprocess.Popen(
        [XUM, "bridge", "--root", str(daemon.root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "XUM_HOST": "elsewhere", "XUM_HOSTS_FILE": str(tmp_short / "none")},
    )
    try:
        assert hello(proc)["pid"] == daemon.pid
    finally:
        proc.kill()
        proc.wait()


def test_bridge_relays_large_frames_byte_for_byte(daemon: DaemonProcess) -> None:
    """A 4 MiB request crosses the bridge in many reads and writes and arrives whole: the
    daemon parses it (and refuses its unknown parameter by name)."""
    proc = bridge("--root", str(daemon.root))
    try:
        big = "é" * (2 * 1024 * 1024)  # 4 MiB of UTF-8
        send(proc.stdin, 7, "daemon.status", padding=big)
        reply = answer(proc.stdout)
        assert reply["id"] == 7
        assert reply["error"]["data"]["kind"] == "invalid_params"
        assert "padding" in json.dumps(reply["error"])
        assert hello(proc, 8)["pid"] == daemon.pid
    finally:
        proc.kill()
        proc.wait()


def test_bridge_starts_a_daemon_over_a_crashed_ones_socket(tmp_short: Path) -> None:
    """A daemon SIGKILLed leaves its socket file (connect: refused): the bridge starts a new
    one, which takes the root (the lock died with the old one) and the socket path."""
    root = tmp_short / "root"
    crashed = DaemonProcess(root).start()
    crashed.kill()
    assert (root / "xumd.sock").exists()
    proc = bridge("--root", str(root))
    try:
        pid = hello(proc)["pid"]
        assert pid != crashed.pid
        holder = read_holder(root / "xumd.lock")
        assert holder is not None and holder["pid"] == pid
    finally:
        proc.kill()
        proc.wait()
        crashed.close()
        stop_root_daemon(root)
