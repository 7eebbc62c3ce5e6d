"""Graceful shutdown and systemd notifications (READY/STOPPING/WATCHDOG on a fake NOTIFY_SOCKET).

`test.sleep` (a test-only method) keeps a request in flight while the daemon is told to stop.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess, write_config
from tests.support.raw import RawPeer
from tests.support.wait import until


def sleeper(seconds: float, request_id: object = "slow") -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "method": "test.sleep",
        "params": {"seconds": seconds},
        "id": request_id,
    }


def start(root: Path, config: str = "", **kwargs: object) -> DaemonProcess:
    write_config(root, "enable_test_methods = true\n" + config)
    return DaemonProcess(root, **kwargs).start()  # type: ignore[arg-type]


def in_flight(daemon: DaemonProcess, n: int = 1) -> bool:
    # The daemon's own count of requests being handled (daemon.status details.rpc.active),
    # less the daemon.status asking.
    status = daemon.call("daemon.status")
    return bool(status["details"]["rpc"]["active"] - 1 >= n)


def test_ready_carries_mainpid_and_stopping_is_sent(root: Path) -> None:
    daemon = DaemonProcess(root)
    daemon.start(wait_ready=False)
    try:
        ready = daemon.wait_for_notify("READY=1")
        assert f"MAINPID={daemon.pid}" in ready.split("\n")
        daemon.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        daemon.wait_for_notify("STOPPING=1")
        assert daemon.wait() == 0
        assert not daemon.socket_path.exists()
    finally:
        daemon.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_with_exit_zero(daemon: DaemonProcess, signum: int) -> None:
    daemon.proc.send_signal(signum)  # type: ignore[union-attr]
    assert daemon.wait() == 0
    assert not daemon.socket_path.exists()
    assert '"daemon.stopped"' in daemon.log_text()


def test_in_flight_request_is_answered_within_the_grace(root: Path) -> None:
    daemon = start(root, "shutdown_grace_s = 20\n")
    try:
        with RawPeer(daemon.socket_path) as peer:
            peer.send_json(sleeper(1.0))
            until(lambda: in_flight(daemon), message="the sleep to be in flight")
            daemon.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            daemon.wait_for_notify("STOPPING=1")
            # Stopping: already open connections are answered, new work is refused...
            peer.send_json({"jsonrpc": "2.0", "method": "get_data", "id": "late"})
            late = peer.read()
            assert late["id"] == "late" and late["error"]["data"]["kind"] == "shutting_down"
            assert late["error"]["code"] == -32008
            # ...status still answers, and says so...
            peer.send_json({"jsonrpc": "2.0", "method": "daemon.status", "id": "st"})
            assert peer.read()["result"]["shutting_down"] is True
            # ...no new connection is accepted...
            with pytest.raises(OSError):
                RawPeer(daemon.socket_path, timeout=2).send("{}\n")
            # ...and the request in flight gets its real answer.
            answer = peer.read()
            assert answer == {"jsonrpc": "2.0", "id": "slow", "result": {"slept": 1.0}}
            assert peer.read_line() is None  # then the daemon closes the connection
        assert daemon.wait() == 0
    finally:
        daemon.close()


def test_requests_past_the_grace_fail_with_shutting_down(root: Path) -> None:
    daemon = start(root, "shutdown_grace_s = 0.2\n")
    try:
        with RawPeer(daemon.socket_path) as peer:
            peer.send_json(sleeper(60, "single"))
            peer.send_json(
                [sleeper(60, "in-batch"), {"jsonrpc": "2.0", "method": "get_data", "id": "quick"}]
            )
            until(lambda: in_flight(daemon, 2), message="both sleeps in flight")
            started = time.monotonic()
            daemon.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            answers = [peer.read(), peer.read()]
            single = next(a for a in answers if isinstance(a, dict))
            batch = next(a for a in answers if isinstance(a, list))
            assert single["id"] == "single" and single["error"]["data"]["kind"] == "shutting_down"
            by_id = {item["id"]: item for item in batch}
            assert by_id["quick"]["result"] == ["hello", 5]
            assert by_id["in-batch"]["error"]["code"] == -32008
        assert daemon.wait() == 0
        assert time.monotonic() - started < 10
    finally:
        daemon.close()


def test_second_signal_forces_exit(root: Path) -> None:
    daemon = start(root, "shutdown_grace_s = 60\n")
    try:
        with RawPeer(daemon.socket_path) as peer:
            peer.send_json(sleeper(60))
            until(lambda: in_flight(daemon), message="the sleep to be in flight")
            daemon.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            daemon.wait_for_notify("STOPPING=1")
            daemon.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            assert daemon.wait(10) == 128 + signal.SIGTERM
        assert "daemon.forced_exit" in daemon.log_text()
    finally:
        daemon.close()


def test_shutdown_method_sends_stopping(daemon: DaemonProcess) -> None:
    assert daemon.call("daemon.shutdown") == {"stopping": True}
    daemon.wait_for_notify("STOPPING=1")
    assert daemon.wait() == 0


def test_watchdog_pings_when_watchdog_usec_is_set(root: Path) -> None:
    daemon = DaemonProcess(root, env={"WATCHDOG_USEC": "300000"}).start()
    try:
        for _ in range(3):
            daemon.wait_for_notify("WATCHDOG=1", timeout=5)
    finally:
        daemon.close()


def test_no_watchdog_pings_for_another_pid(root: Path) -> None:
    daemon = DaemonProcess(root, env={"WATCHDOG_USEC": "300000", "WATCHDOG_PID": "1"}).start()
    try:
        with pytest.raises(TimeoutError):
            daemon.wait_for_notify("WATCHDOG=1", timeout=1)
    finally:
        daemon.close()
