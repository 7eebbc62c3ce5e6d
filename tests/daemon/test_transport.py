"""The transport: frame cap, slow and dead clients, many clients, the bounded outbox."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import anyio
import psutil
import pytest
from xumd.base.config import DaemonConfig
from xumd.rpc.outbox import Outbox, OutboxClosed

from tests.support.daemon import DaemonProcess, write_config
from tests.support.raw import RawPeer, exchange

STATUS = '{"jsonrpc": "2.0", "method": "daemon.status", "id": 1}\n'


def status_ok(sock: Path) -> bool:
    answers = exchange(sock, STATUS)
    return len(answers) == 1 and "result" in answers[0]


def test_default_frame_cap_is_16_mib() -> None:
    assert DaemonConfig().max_frame_bytes == 16 * 1024 * 1024


def test_oversize_frame_gets_an_error_and_only_that_connection_closes(root: Path) -> None:
    write_config(root, "max_frame_bytes = 4096\n")
    daemon = DaemonProcess(root).start()
    try:
        with RawPeer(daemon.socket_path) as bystander, RawPeer(daemon.socket_path) as big:
            # Just under the cap passes (the frame is padded with spaces, which JSON allows).
            request = '{"jsonrpc": "2.0", "method": "daemon.status", "id": 1}'
            big.send(request + " " * (4000 - len(request)) + "\n")
            assert big.read()["id"] == 1
            # Over the cap, in pieces and without a newline: an error, then EOF.
            for _ in range(5):
                big.send(b"x" * 1000)
            error = big.read()
            assert error["id"] is None
            assert error["error"]["code"] == -32011
            assert error["error"]["data"] == {"kind": "frame_too_large", "limit": 4096}
            assert big.read_line() is None  # closed by the daemon
            # The other connection and the daemon are unaffected.
            bystander.send(STATUS)
            assert bystander.read()["result"]["pid"] == daemon.pid
        assert status_ok(daemon.socket_path)
    finally:
        daemon.close()


def test_a_client_that_never_reads_does_not_stall_others(root: Path) -> None:
    # Small queues so the flood reaches backpressure quickly.
    write_config(
        root,
        "enable_test_methods = true\nwrite_queue_messages = 8\nmax_inflight_per_connection = 4\n",
    )
    daemon = DaemonProcess(root, log_level="info").start()
    flooder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    flooder.connect(str(daemon.socket_path))
    flooder.settimeout(1.0)
    request = b'{"jsonrpc": "2.0", "method": "get_data", "id": 1}\n' * 256
    blocked = threading.Event()

    def flood() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                flooder.sendall(request)
            except TimeoutError:
                # The daemon stopped reading from us: backpressure, not unbounded buffering.
                blocked.set()
                return
            except OSError:
                return

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    try:
        assert blocked.wait(30), "the flooding client was never pushed back"
        started = time.monotonic()
        with RawPeer(daemon.socket_path, timeout=5) as other:
            for i in range(50):
                other.send_json({"jsonrpc": "2.0", "method": "daemon.status", "id": i})
                assert other.read()["id"] == i
        assert time.monotonic() - started < 10
        # The flooder is still connected (slowed down, not dropped) and still never reads.
        assert daemon.call("daemon.status")["connections"] >= 2
        assert psutil.Process(daemon.pid).memory_info().rss < 512 * 1024 * 1024
        flooder.close()
        thread.join(5)
        # Once it is gone, the daemon serves on and stops cleanly.
        assert status_ok(daemon.socket_path)
        assert daemon.terminate() == 0
    finally:
        flooder.close()
        daemon.close()


def test_many_concurrent_clients(daemon: DaemonProcess) -> None:
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            with RawPeer(daemon.socket_path) as peer:
                for i in range(10):
                    peer.send_json({"jsonrpc": "2.0", "method": "daemon.status", "id": f"{n}-{i}"})
                    assert peer.read()["id"] == f"{n}-{i}"
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[:3]


def test_a_client_that_disconnects_mid_request_harms_nobody(daemon: DaemonProcess) -> None:
    for _ in range(20):
        peer = RawPeer(daemon.socket_path)
        peer.send(STATUS * 10)
        peer.close()  # gone before the answers
    assert status_ok(daemon.socket_path)


def test_socat_style_one_liner_without_hello(daemon: DaemonProcess) -> None:
    answers = exchange(daemon.socket_path, STATUS)
    assert answers[0]["result"]["protocol"] == "1.5"
    assert answers[0]["result"]["pid"] == daemon.pid


# -- the outbox, unit level -------------------------------------------------------------------


def test_outbox_bounds_messages_and_bytes() -> None:
    async def main() -> None:
        box = Outbox(max_messages=3, max_bytes=10)
        assert box.put_nowait(b"x" * 50)  # an empty queue takes any single frame
        assert not box.put_nowait(b"y")
        assert await box.get() == b"x" * 50
        assert box.put_nowait(b"abcd") and box.put_nowait(b"efgh")
        assert not box.put_nowait(b"ijk")  # 8 + 3 > 10 bytes
        assert box.put_nowait(b"ij")
        assert not box.put_nowait(b"")  # 3 messages
        box.close()
        with pytest.raises(OutboxClosed):
            box.put_nowait(b"z")
        assert [await box.get() for _ in range(4)] == [b"abcd", b"efgh", b"ij", None]

    anyio.run(main)


def test_outbox_put_waits_for_room() -> None:
    async def main() -> None:
        box = Outbox(max_messages=1, max_bytes=100)
        box.put_nowait(b"first")
        done = anyio.Event()

        async def producer() -> None:
            await box.put(b"second")
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(producer)
            await anyio.wait_all_tasks_blocked()
            assert not done.is_set()
            assert await box.get() == b"first"
            with anyio.fail_after(5):
                await done.wait()
        assert await box.get() == b"second"

    anyio.run(main)


def test_request_lines_are_json_objects() -> None:
    # Guard for the helpers above: STATUS is one valid JSON-RPC frame.
    assert json.loads(STATUS)["method"] == "daemon.status"


def test_unencodable_result_becomes_an_internal_error_with_its_id() -> None:
    from xum_protocol import framing
    from xumd.rpc.connection import _unencodable

    response = {"jsonrpc": "2.0", "id": 7, "result": {"n": 2**70}}
    with pytest.raises(TypeError):
        framing.encode(response)
    fixed = json.loads(framing.encode(_unencodable([response, response])))
    assert [item["id"] for item in fixed] == [7, 7]
    assert {item["error"]["code"] for item in fixed} == {-32603}
