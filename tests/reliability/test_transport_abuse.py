"""Transport abuse on a real daemon: oversized frames, idle and half-sent connections, a client
that never reads, connection churn, deep pipelining. The daemon stays up, stays responsive, and
gives back what each connection held (connections, file descriptors, memory)."""

from __future__ import annotations

import fcntl
import socket
import struct
import threading
import time

import psutil
import pytest

from tests.reliability import wire
from tests.reliability.budget import size
from tests.support.daemon import DaemonProcess
from tests.support.wait import until

pytestmark = pytest.mark.reliability

STATUS = b'{"jsonrpc":"2.0","id":%d,"method":"daemon.status"}\n'


def _fds(daemon: DaemonProcess) -> int:
    return int(psutil.Process(daemon.pid).num_fds())


def _rss_mib(daemon: DaemonProcess) -> float:
    return float(psutil.Process(daemon.pid).memory_info().rss) / 2**20


def _connections(daemon: DaemonProcess) -> int:
    # The health connection itself is counted.
    return int(wire.status(daemon.socket_path)["connections"])


def test_oversized_frame_errors_then_closes_after_earlier_answers(
    fuzz_daemon: DaemonProcess,
) -> None:
    big = b'{"jsonrpc":"2.0","id":2,"method":"daemon.status","params":{"x":"' + b"a" * 300_000
    messages = wire.exchange(fuzz_daemon.socket_path, [STATUS % 1, big + b'"}}\n', STATUS % 3])
    got, responses = wire.received(messages)
    assert got.ids == {1: 1}, "the request before the oversized frame is answered, none after"
    assert responses[-1]["error"]["data"]["kind"] == "frame_too_large"
    assert responses[-1]["error"]["data"]["limit"] == 65536
    assert wire.status(fuzz_daemon.socket_path)["pid"] == fuzz_daemon.pid


SIOCOUTQ = 0x5411  # Linux: bytes a Unix socket sent that the peer has not read yet


def _unread(sock: socket.socket) -> int:
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), SIOCOUTQ, b"\0" * 4))[0])


def test_frame_cap_is_exact(fuzz_daemon: DaemonProcess) -> None:
    """A frame of cap + 4 KiB, delivered in two reads, is refused like any oversized frame."""
    frame = b'{"jsonrpc":"2.0","id":1,"method":"daemon.status","params":{"x":"'
    frame += b"c" * (65536 + 4096 - len(frame) - 4) + b'"}}\n'
    sock = wire.connect(fuzz_daemon.socket_path)
    try:
        sock.sendall(frame[:60_000])
        # The daemon has read the first part (nothing left unread) before the rest arrives.
        until(lambda: _unread(sock) == 0, 10, message="daemon read the first part")
        sock.sendall(frame[60_000:])
        sock.shutdown(socket.SHUT_WR)
        _, responses = wire.received(wire.read_all(sock))
    finally:
        sock.close()
    assert [r.get("error", {}).get("data", {}).get("kind") for r in responses] == [
        "frame_too_large"
    ]


@pytest.mark.parametrize("depth", [1024, 1025, 30_000])
def test_deep_nesting_is_a_clear_error(fuzz_daemon: DaemonProcess, depth: int) -> None:
    frames = [
        b"[" * depth + b"]" * depth + b"\n",
        b'{"jsonrpc":"2.0","id":7,"method":"daemon.status","params":{"x":'
        + b"[" * depth
        + b"]" * depth
        + b"}}\n",
    ]
    for frame in frames:
        _, responses = wire.received(wire.exchange(fuzz_daemon.socket_path, [frame]))
        assert responses, "no answer to a deeply nested frame"
        for response in responses:
            assert "error" in response, response
            assert response["error"]["code"] != -32603, response


def test_idle_and_half_sent_connections_do_not_block_others(fuzz_daemon: DaemonProcess) -> None:
    before = _connections(fuzz_daemon)
    fds_before = _fds(fuzz_daemon)
    held: list[socket.socket] = []
    try:
        for index in range(size(300, 100)):
            sock = wire.connect(fuzz_daemon.socket_path)
            if index % 3 == 0:  # half a frame, never finished
                sock.sendall(b'{"jsonrpc":"2.0","id":1,"method":"daemon.st')
            if index % 3 == 1:  # a large partial frame (still under the cap)
                sock.sendall(b'{"jsonrpc":"2.0","id":1,"params":{"x":"' + b"b" * 60_000)
            held.append(sock)
        started = time.monotonic()
        status = wire.status(fuzz_daemon.socket_path, timeout=5)
        assert time.monotonic() - started < 2.0, "status slowed down by idle connections"
        assert status["connections"] >= len(held)
    finally:
        for sock in held:
            sock.close()
    until(lambda: _connections(fuzz_daemon) <= before, 10, message="connections released")
    until(lambda: _fds(fuzz_daemon) <= fds_before + 2, 10, message="fds released")


def test_client_that_never_reads_is_bounded(fuzz_daemon: DaemonProcess) -> None:
    """Pipelining without reading: the daemon either pushes back (stops reading us, bounded
    in-flight) or drops us as a slow client; it never buffers without bound, and whatever it
    did answer is answered once."""
    sock = wire.connect(fuzz_daemon.socket_path)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stream = b""
    dropped = False
    deadline = time.monotonic() + 30
    batch = 200
    sock.settimeout(1.0)
    try:
        while time.monotonic() < deadline:
            payload = b"".join(STATUS % i for i in range(len(stream), len(stream) + batch))
            try:
                sock.sendall(payload)
            except (BrokenPipeError, ConnectionResetError):
                dropped = True
                break
            except TimeoutError:
                break  # back-pressure: the daemon stopped reading us
            stream += payload
        rss = _rss_mib(fuzz_daemon)
        if not dropped:
            sock.shutdown(socket.SHUT_WR)
        try:
            messages = wire.read_all(sock, timeout=60)
        except (ConnectionResetError, AssertionError):
            messages, dropped = [], True
    finally:
        sock.close()
    assert stream, "nothing could be sent at all"
    assert rss < 200, f"daemon RSS {rss:.0f} MiB while a client refused to read"
    got, _ = wire.received(messages)
    assert all(count == 1 for count in got.ids.values()), "an answer was duplicated"
    if not dropped:
        # Complete requests we managed to send are all answered (a partial one is not).
        assert len(got.ids) >= len(wire.frames_of(stream)) - 1
    assert wire.status(fuzz_daemon.socket_path)["pid"] == fuzz_daemon.pid


def test_connection_churn_leaks_nothing(fuzz_daemon: DaemonProcess) -> None:
    wire.status(fuzz_daemon.socket_path)
    fds_before = _fds(fuzz_daemon)
    rss_before = _rss_mib(fuzz_daemon)
    conns_before = _connections(fuzz_daemon)
    for index in range(size(3000, 600)):
        sock = wire.connect(fuzz_daemon.socket_path)
        if index % 2:
            sock.sendall(STATUS % index)
            sock.recv(4096)
        sock.close()
    until(lambda: _connections(fuzz_daemon) <= conns_before, 10, message="connections released")
    until(lambda: _fds(fuzz_daemon) <= fds_before + 2, 10, message="fds released")
    assert _rss_mib(fuzz_daemon) - rss_before < 15, "memory grew with connection churn"


def test_deep_pipeline_gets_every_answer_once(fuzz_daemon: DaemonProcess) -> None:
    count = size(20_000, 4_000)
    sock = wire.connect(fuzz_daemon.socket_path)
    messages: list[object] = []

    def reader() -> None:
        messages.extend(wire.read_all(sock, timeout=60))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for start in range(0, count, 500):
            sock.sendall(b"".join(STATUS % i for i in range(start, min(count, start + 500))))
        sock.shutdown(socket.SHUT_WR)
        thread.join(90)
        assert not thread.is_alive(), "answers did not finish"
    finally:
        sock.close()
    got, _ = wire.received(messages)
    assert got.ids == {i: 1 for i in range(count)}
