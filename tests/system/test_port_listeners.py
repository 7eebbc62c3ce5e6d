"""Who listens on a port, as each platform backend reads it (`listeners`): what `workspace.get`
names when one of a workspace's ports is busy. Real listening sockets in real processes, IPv4 and
IPv6, two processes sharing a port through SO_REUSEPORT (each is named: a foreign one beside the
workspace's own server must not hide behind it), and a socket table that cannot be read (holder
unknown, never "nobody")."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from types import ModuleType

import pytest
from xumd.system.platform import linux, portable

from tests.lifecycle.test_workspace_env_ports import port_range
from tests.support.listeners import Listen, listening

BACKENDS = [pytest.param(linux, id="linux"), pytest.param(portable, id="portable")]


@pytest.fixture
def listen() -> Iterator[Listen]:
    yield from listening()


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_listener_is_named_by_pid(backend: ModuleType, listen: Listen) -> None:
    start, _ = port_range(4)
    v4, v6, shared, idle = start, start + 1, start + 2, start + 3
    first = listen(v4).pid
    second = listen(v6, "::1").pid
    own = listen(shared).pid
    foreign = listen(shared).pid  # SO_REUSEPORT: a socket of its own on the same port
    found = backend.listeners({v4, v6, shared, idle})
    assert found == {v4: {first}, v6: {second}, shared: {own, foreign}}


def test_a_socket_table_that_cannot_be_read_names_no_one_but_says_so(
    monkeypatch: pytest.MonkeyPatch, listen: Listen
) -> None:
    """A table that cannot be read (here: a directory where /proc/net/tcp should be) gives an
    unknown holder for every port asked about: the port the bind probe found busy stays
    reported, never dropped as nobody's."""
    start, _ = port_range(2)
    listen(start)
    monkeypatch.setattr(linux, "_NET_TABLES", ("/proc/self",))
    assert linux.listeners({start, start + 1}) == {start: {None}, start + 1: {None}}


def test_the_table_is_read_for_listening_sockets_only(listen: Listen) -> None:
    """A connected socket on the port (a client of the server) is no listener."""
    start, _ = port_range(1)
    server = listen(start).pid
    with socket.create_connection(("127.0.0.1", start), timeout=10):
        assert linux.listeners({start}) == {start: {server}}
        assert portable.listeners({start}) == {start: {server}}
