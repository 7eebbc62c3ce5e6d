"""The Python clients, sync and async, against a real daemon (with test methods enabled)."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from xum_client import AsyncClient, Client
from xum_client.errors import (
    ClientTimeout,
    ConnectionLost,
    DaemonNotRunning,
    InvalidParams,
    MethodNotFound,
    ProtocolMismatch,
    XumRpcError,
)
from xum_protocol.models.daemon import DaemonStatusResult

from tests.support.daemon import DaemonProcess, short_tmpdir, write_config


@pytest.fixture(scope="module")
def test_daemon() -> Iterator[DaemonProcess]:
    tmp = short_tmpdir()
    root = tmp / "root"
    write_config(root, "enable_test_methods = true\nwrite_queue_messages = 64\n")
    proc = DaemonProcess(root, log_level="info").start()
    yield proc
    proc.close()
    shutil.rmtree(tmp, ignore_errors=True)


# -- sync -------------------------------------------------------------------------------------


def test_sync_typed_errors(test_daemon: DaemonProcess) -> None:
    with Client(test_daemon.root) as client:
        with pytest.raises(MethodNotFound) as caught:
            client.call("no.such")
        assert caught.value.kind == "method_not_found" and caught.value.code == -32601
        with pytest.raises(InvalidParams) as invalid:
            client.call("subtract", {"minuend": "x"})
        assert invalid.value.data["errors"]


def test_sync_typed_call(test_daemon: DaemonProcess) -> None:
    with Client(test_daemon.root) as client:
        status = client.call_model("daemon.status", None, DaemonStatusResult)
        assert status.pid == test_daemon.pid


def test_sync_timeout(test_daemon: DaemonProcess) -> None:
    with Client(test_daemon.root, timeout=0.3) as client:
        with pytest.raises(ClientTimeout):
            client.call("test.sleep", {"seconds": 1.5})
        # The stream may hold half an answer now: a later call is a typed error saying so
        # (it was a raw OSError, "cannot read from timed out object"), and sends nothing.
        with pytest.raises(ConnectionLost, match="timed out; nothing more was sent"):
            client.call("daemon.status")
        with pytest.raises(ConnectionLost, match="open a new client"):
            client.next_notification()


def test_no_daemon_and_stale_socket(tmp_short: Path) -> None:
    with pytest.raises(DaemonNotRunning) as caught:
        Client(tmp_short)
    assert "no socket" in str(caught.value)
    # A socket file nobody listens on (a crashed daemon's): refused, said so.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_short / "xumd.sock"))
    stale.close()
    with pytest.raises(DaemonNotRunning) as stale_caught:
        Client(tmp_short)
    assert "stale socket" in str(stale_caught.value)


def test_sync_events(test_daemon: DaemonProcess) -> None:
    with Client(test_daemon.root) as client:
        snapshot = client.call("events.subscribe", {"types": ["test."]})
        with Client(test_daemon.root) as other:
            other.call("test.publish", {"type": "other.thing"})
            other.call("test.publish", {"type": "test.thing", "data": {"n": 1}})
        event = client.next_notification()
        assert event["method"] == "event"
        assert event["params"]["type"] == "test.thing"
        assert event["params"]["seq"] == snapshot["seq"] + 2  # other.thing was filtered out
        assert event["params"]["data"] == {"n": 1}


# -- async ------------------------------------------------------------------------------------


def test_async_handshake_status_and_concurrent_calls(test_daemon: DaemonProcess) -> None:
    async def main() -> None:
        async with AsyncClient(test_daemon.root) as client:
            assert client.server is not None and client.server.protocol == "1.5"
            status = await client.status()
            assert isinstance(status, DaemonStatusResult) and status.pid == test_daemon.pid
            results: dict[int, dict[str, object]] = {}

            async def one(i: int) -> None:
                results[i] = await client.call("test.sleep", {"seconds": 0.01 * (i % 5)})

            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    for i in range(30):
                        tg.start_soon(one, i)
            assert {i: r["slept"] for i, r in results.items()} == {
                i: 0.01 * (i % 5) for i in range(30)
            }

    anyio.run(main)


def test_async_typed_errors_and_timeout(test_daemon: DaemonProcess) -> None:
    async def main() -> None:
        async with AsyncClient(test_daemon.root) as client:
            with pytest.raises(MethodNotFound):
                await client.call("no.such")
            with pytest.raises(ClientTimeout):
                await client.call("test.sleep", {"seconds": 1.5}, timeout=0.2)
            # The connection is still usable after a client-side timeout.
            assert (await client.status()).pid == test_daemon.pid

    anyio.run(main)


def test_async_protocol_mismatch(
    test_daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("xum_client.sync.PROTOCOL_VERSION", "7.0")

    async def main() -> None:
        with pytest.raises(ProtocolMismatch) as caught:
            async with AsyncClient(test_daemon.root):
                pass
        assert isinstance(caught.value, XumRpcError)
        assert caught.value.data["server_protocols"] == ["1.5"]

    anyio.run(main)


def test_async_no_daemon(tmp_short: Path) -> None:
    async def main() -> None:
        with pytest.raises(DaemonNotRunning):
            async with AsyncClient(tmp_short):
                pass

    anyio.run(main)


def test_async_subscription_snapshot_then_events_in_order(test_daemon: DaemonProcess) -> None:
    async def main() -> None:
        async with (
            AsyncClient(test_daemon.root) as client,
            client.subscribe(["test."]) as events,
        ):
            start = events.snapshot.seq
            await client.call("test.publish", {"type": "test.burst", "count": 20})
            seen = []
            with anyio.fail_after(10):
                async for event in events:
                    seen.append(event.seq)
                    if len(seen) == 20:
                        break
            assert seen == list(range(start + 1, start + 21))

    anyio.run(main)


def test_a_subscriber_that_never_reads_is_dropped_not_buffered(
    test_daemon: DaemonProcess,
) -> None:
    # write_queue_messages = 64 for this daemon: a burst far beyond it, on a subscriber that
    # does not read, drops that subscriber; everyone else carries on.
    with Client(test_daemon.root) as lazy:
        lazy.call("events.subscribe", {"types": ["test.flood"]})
        with Client(test_daemon.root) as other:
            other.call("test.publish", {"type": "test.flood", "count": 50_000})
            assert "slow_client_dropped" in test_daemon.log_text()
            assert other.call("daemon.status")["pid"] == test_daemon.pid
