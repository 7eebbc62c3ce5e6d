"""Who listens on a port, as each platform backend reads it (`listeners`): what `workspace.get`
names when one of a workspace's ports is busy. Real listening sockets in real processes, IPv4 and
IPv6, two processes sharing a port through SO_REUSEPORT (each is named: a foreign one beside the
workspace's own server must not hide behind it), and a socket table that cannot be read (holder
unknown, never "nobody")."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
from xumd.system.platform import linux, portable

from tests.lifecycle.test_workspace_env_ports import port_range

LISTENER = (
    "import socket, sys\n"
    "family = socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET\n"
    "s = socket.socket(family, socket.SOCK_STREAM)\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
    "if family == socket.AF_INET6:\n"
    "    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)\n"
    "s.bind((sys.argv[1], int(sys.argv[2])))\n"
    "s.listen()\n"
    "print('listening', flush=True)\n"
    "sys.stdin.read()\n"
)

Listen = Callable[[str, int], int]
"""Start a listener in a process of its own on (address, port); its pid."""

BACKENDS = [pytest.param(linux, id="linux"), pytest.param(portable, id="portable")]


@pytest.fixture
def listen() -> Iterator[Listen]:
    started: list[subprocess.Popen[str]] = []

    def start(address: str, port: int) -> int:
        proc = subprocess.Popen(
            [sys.executable, "-c", LISTENER, address, str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "listening":
            proc.wait(timeout=10)
            assert proc.stderr is not None
            pytest.skip(f"cannot listen on {address}: {proc.stderr.read().strip()}")
        return proc.pid

    yield start
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_listener_is_named_by_pid(backend: ModuleType, listen: Listen) -> None:
    start, _ = port_range(4)
    v4, v6, shared, idle = start, start + 1, start + 2, start + 3
    first = listen("127.0.0.1", v4)
    second = listen("::1", v6)
    own = listen("127.0.0.1", shared)
    foreign = listen("127.0.0.1", shared)  # SO_REUSEPORT: a socket of its own on the same port
    found = backend.listeners({v4, v6, shared, idle})
    assert found == {v4: {first}, v6: {second}, shared: {own, foreign}}


def test_a_socket_table_that_cannot_be_read_names_no_one_but_says_so(
    monkeypatch: pytest.MonkeyPatch, listen: Listen
) -> None:
    """A table that cannot be read (here: a directory where /proc/net/tcp should be) gives an
    unknown holder for every port asked about: the port the bind probe found busy stays
    reported, never dropped as nobody's."""
    start, _ = port_range(2)
    listen("127.0.0.1", start)
    monkeypatch.setattr(linux, "_NET_TABLES", ("/proc/self",))
    assert linux.listeners({start, start + 1}) == {start: {None}, start + 1: {None}}


def test_the_table_is_read_for_listening_sockets_only(listen: Listen) -> None:
    """A connected socket on the port (a client of the server) is no listener."""
    start, _ = port_range(1)
    server = listen("127.0.0.1", start)
    with socket.create_connection(("127.0.0.1", start), timeout=10):
        assert linux.listeners({start}) == {start: {server}}
        assert portable.listeners({start}) == {start: {server}}
