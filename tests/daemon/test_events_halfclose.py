"""A subscriber that half-closes (shuts down its sending side, as `socat` does when its input ends)
keeps receiving events until it closes the connection itself. Connections
that did not subscribe keep their behaviour: answer what was read, then close."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, serve
from tests.support.raw import RawPeer, exchange
from tests.support.wait import until


@pytest.fixture
def daemon() -> Iterator[DaemonProcess]:
    config = "enable_test_methods = true\nwrite_queue_messages = 16\n"
    yield from serve("xumhc-", config)


def _request(method: str, params: dict[str, Any], id_: int = 1) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}) + "\n"


def publish(daemon: DaemonProcess, type_: str, count: int = 1, **data: Any) -> int:
    seq: int = daemon.call("test.publish", {"type": type_, "count": count, "data": data})["seq"]
    return seq


def connections(daemon: DaemonProcess) -> int:
    """Connections the daemon serves, not counting the one that asks."""
    count: int = daemon.call("daemon.status")["connections"]
    return count - 1


def test_a_half_closed_subscriber_keeps_receiving_events_until_it_hangs_up(
    daemon: DaemonProcess,
) -> None:
    with RawPeer(daemon.socket_path) as peer:
        peer.send(_request("events.subscribe", {"types": ["test."]}))
        peer.shut_write()
        answer = peer.read()
        assert answer["id"] == 1 and answer["result"]["snapshot"] is not None
        # The daemon has seen the end of input and keeps the connection (no race with it).
        until(lambda: "conn.half_closed_subscriber" in daemon.log_text(), message="the EOF")
        first = publish(daemon, "test.one")
        second = publish(daemon, "test.two")
        assert [peer.read()["params"]["seq"] for _ in range(2)] == [first, second]
    # It hung up: the daemon notices without any event to write, and lets the connection go.
    until(lambda: connections(daemon) == 0, message="the hung-up subscriber's connection to end")
    assert "conn.subscriber_hung_up" in daemon.log_text()


def test_a_hung_up_subscriber_is_also_dropped_by_the_next_event(daemon: DaemonProcess) -> None:
    with RawPeer(daemon.socket_path) as peer:
        peer.send(_request("events.subscribe", {}))
        peer.shut_write()
        assert "result" in peer.read()
    publish(daemon, "test.after_hangup", count=3)
    until(lambda: connections(daemon) == 0, message="the subscriber's connection to end")


def test_a_half_closed_connection_that_did_not_subscribe_still_closes(
    daemon: DaemonProcess,
) -> None:
    answers = exchange(
        daemon.socket_path,
        _request("daemon.status", {}) + _request("test.publish", {"type": "test.x"}, id_=2),
    )
    # Both answered, then EOF (exchange reads until the daemon closes).
    assert sorted(a["id"] for a in answers) == [1, 2]


def test_a_subscribe_that_fails_does_not_keep_a_half_closed_connection(
    daemon: DaemonProcess,
) -> None:
    answers = exchange(daemon.socket_path, _request("events.subscribe", {"after_seq": 1}))
    assert [a["error"]["data"]["kind"] for a in answers] == ["invalid_params"]


def test_a_half_closed_subscriber_that_does_not_read_is_dropped(daemon: DaemonProcess) -> None:
    with RawPeer(daemon.socket_path) as peer:
        peer.send(_request("events.subscribe", {}))
        peer.shut_write()
        # Never read: the outbox (16 messages) fills once the socket buffers do.
        for _ in range(50):
            publish(daemon, "test.flood", count=200, pad="x" * 2000)
            if "conn.slow_client_dropped" in daemon.log_text():
                break
        assert "conn.slow_client_dropped" in daemon.log_text()
        until(
            lambda: connections(daemon) == 0, message="the dropped subscriber's connection to end"
        )


def test_a_half_closed_subscriber_ends_when_the_daemon_stops(daemon: DaemonProcess) -> None:
    with RawPeer(daemon.socket_path) as peer:
        peer.send(_request("events.subscribe", {}))
        peer.shut_write()
        assert "result" in peer.read()
        daemon.call("daemon.shutdown")
        # The daemon closes it as part of a graceful stop: EOF, not a forced close.
        assert peer.read_all(timeout=30) == []
    assert daemon.wait(timeout=30) == 0
    assert "daemon.connection_forced_closed" not in daemon.log_text()


@pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_protocol_md_watch_events_with_socat_works_as_written(
    daemon: DaemonProcess, stop: signal.Signals
) -> None:
    """The example of docs/PROTOCOL.md, run through a shell exactly as written there; then socat
    ends (politely, or killed): the daemon lets the connection go without an event to write."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md").read_text()
    block = text.split("# watch events", 1)[1].split("```", 1)[0]
    lines = block.splitlines()[1:]  # the rest of the comment line
    command = "\n".join(line for line in lines if not line.startswith("#")).strip()
    assert command.startswith("echo ") and "socat -t 86400 - UNIX-CONNECT:$SOCK" in command
    proc = subprocess.Popen(
        ["bash", "-c", command],
        env={**os.environ, "SOCK": str(daemon.socket_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        answer = json.loads(proc.stdout.readline())
        assert answer["id"] == 1 and "snapshot" in answer["result"]
        # socat's input has ended (echo is done) and it still receives what follows.
        until(lambda: connections(daemon) == 1, message="socat's connection")
        until(lambda: "conn.half_closed_subscriber" in daemon.log_text(), message="the EOF")
        seq = publish(daemon, "workspace.test_event")
        publish(daemon, "project.not_wanted")
        event = json.loads(proc.stdout.readline())
        assert event["method"] == "event" and event["params"]["seq"] == seq
        assert proc.poll() is None, "socat exited after the answer"
    finally:
        os.killpg(proc.pid, stop)
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()
    until(lambda: connections(daemon) == 0, message="socat's connection to end")


def test_a_subscriber_that_closes_is_let_go_at_once_not_kept_as_half_closed(
    daemon: DaemonProcess,
) -> None:
    with RawPeer(daemon.socket_path) as peer:
        peer.send(_request("events.subscribe", {}))
        assert "result" in peer.read()
    # Closed, both sides: end of input and a hangup together; nothing to keep streaming to.
    until(lambda: connections(daemon) == 0, message="the closed subscriber's connection to end")
    assert "conn.half_closed_subscriber" not in daemon.log_text()


def test_a_subscribe_sent_as_a_notification_subscribes_without_an_answer(
    daemon: DaemonProcess,
) -> None:
    """PROTOCOL.md: a notification is run and never answered; a subscribe is no exception. Its
    events (not answers) follow, and a half-close keeps the connection as for any subscriber."""
    with RawPeer(daemon.socket_path) as peer:
        peer.send(json.dumps({"jsonrpc": "2.0", "method": "events.subscribe"}) + "\n")
        peer.shut_write()
        until(lambda: "conn.half_closed_subscriber" in daemon.log_text(), message="the EOF")
        seq = publish(daemon, "test.after_notification")
        first = peer.read()
        assert "id" not in first and first["method"] == "event"
        assert first["params"]["seq"] == seq


def test_one_subscriber_that_does_not_read_is_dropped_the_others_miss_nothing(
    daemon: DaemonProcess,
) -> None:
    """One busy (non-reading) subscriber of two: it is dropped; the reading one, half-closed
    too, gets every event in order, before and after the drop."""
    got: list[int] = []
    with RawPeer(daemon.socket_path) as lazy, RawPeer(daemon.socket_path) as reader:
        for peer in (lazy, reader):
            peer.send(_request("events.subscribe", {"types": ["test."]}))
            peer.shut_write()
            assert "result" in peer.read()

        def read() -> None:
            while True:
                event = reader.read()["params"]
                got.append(event["seq"])
                if event["type"] == "test.after_the_drop":
                    return

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        # Small bursts, so a reader that keeps up is never behind by a whole write queue.
        first = publish(daemon, "test.flood", pad="x" * 2000)
        for _ in range(400):
            last = publish(daemon, "test.flood", count=4, pad="x" * 2000)
            if "conn.slow_client_dropped" in daemon.log_text():
                break
        assert "conn.slow_client_dropped" in daemon.log_text()
        last = publish(daemon, "test.after_the_drop")
        thread.join(timeout=30)
        assert not thread.is_alive()
        until(lambda: connections(daemon) == 1, message="only the reading subscriber left")
    assert got == list(range(first, last + 1)), "a gap or a duplicate for the reading subscriber"
