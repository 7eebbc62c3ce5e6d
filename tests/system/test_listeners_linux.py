"""The Linux backend's `listeners` past the cases every backend shares (test_port_listeners.py):
a listener of another user, a socket a forking server shares with its child, a table that is
not there, a reader that may not look at the holder's descriptors, a process gone between the
listing and the look, and out of descriptors (raised, never "nobody"). Real listening sockets in
real processes; the faults are an error from one system call. The fast selection `make mutate`
runs for `listeners` (a few seconds)."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xumd.system.platform import linux

from tests.lifecycle.test_workspace_env_ports import port_range
from tests.support.listeners import LISTENER, Listen, listening
from tests.support.otheruser import NOBODY, as_nobody

if not sys.platform.startswith("linux"):
    pytest.skip("the Linux backend", allow_module_level=True)

FORKING = LISTENER.replace(
    "print('listening', flush=True)\n",
    "import os\nif os.fork() == 0:\n    sys.stdin.read()\n    os._exit(0)\n"
    "print('listening', flush=True)\n",
)
"""A listener whose forked child holds the same socket (a pre-forking server)."""


@pytest.fixture
def listen() -> Iterator[Listen]:
    yield from listening()


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def test_a_listener_of_another_user_is_found_among_that_users_processes() -> None:
    if os.geteuid() != 0:
        pytest.skip("a listener of another user needs root to start it")
    port, _ = port_range(1)
    ready, hold = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # (forked, not run: `nobody` may not execute the venv's python)
        try:
            os.close(ready[0])
            os.close(hold[1])  # the parent's alone: its close is the child's end
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            server = socket.socket()
            server.bind(("127.0.0.1", port))
            server.listen()
            os.write(ready[1], b"1")
            os.read(hold[0], 1)
        finally:
            os._exit(0)
    os.close(ready[1])  # the child's end alone: a child that failed is an empty read
    os.close(hold[0])
    try:
        assert os.read(ready[0], 1) == b"1", "the listener did not start"
        assert linux.listeners({port}) == {port: {pid}}
    finally:
        os.close(hold[1])  # the child's read returns: it ends
        os.waitpid(pid, 0)
        os.close(ready[0])


def test_a_socket_a_forking_server_shares_is_named_once_by_the_newer_process(
    listen: Listen,
) -> None:
    port, _ = port_range(1)
    parent = listen(port, code=FORKING).pid
    (child,) = children(parent)
    if child < parent:
        pytest.skip("the pid counter wrapped between the two")
    assert linux.listeners({port}) == {port: {child}}


def test_a_table_that_is_not_there_is_skipped(
    listen: Listen, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    port, _ = port_range(1)
    server = listen(port).pid
    monkeypatch.setattr(linux, "_NET_TABLES", (str(tmp_path / "none"), *linux._NET_TABLES))
    assert linux.listeners({port}) == {port: {server}}


def test_a_holder_whose_descriptors_may_not_be_read_is_unknown(listen: Listen) -> None:
    port, _ = port_range(1)
    server = listen(port).pid
    # Root's process, read as `nobody`: its socket is there, its holder cannot be told.
    assert as_nobody(lambda: linux._socket_inodes(server)) == set()
    assert as_nobody(lambda: linux.listeners({port})) == {port: {None}}


def test_a_proc_that_cannot_be_listed_leaves_the_holder_unknown(
    listen: Listen, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, _ = port_range(1)
    listen(port)
    real = os.scandir

    def unlistable(path: Any = ".") -> Any:
        if path == "/proc":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return real(path)

    monkeypatch.setattr(os, "scandir", unlistable)
    assert linux.listeners({port}) == {port: {None}}


def test_a_process_gone_between_the_listing_and_the_look_is_skipped(
    listen: Listen, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    port, _ = port_range(1)
    server = listen(port).pid
    # An entry /proc listed whose process is gone when looked at (a dangling link: its stat
    # fails as the gone process's does), listed before the live ones.
    gone = tmp_path / "gone"
    gone.mkdir()
    (gone / str(server + 1)).symlink_to(tmp_path / "nothing")
    real = os.scandir

    def with_a_gone_process(path: Any = ".") -> Any:
        if path == "/proc":
            return iter([*real(gone), *real(path)])
        return real(path)

    monkeypatch.setattr(os, "scandir", with_a_gone_process)
    assert server in linux.owned_by({os.geteuid()})
    assert linux.listeners({port}) == {port: {server}}


def test_a_descriptor_closed_while_the_table_is_read_is_skipped(
    listen: Listen, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, _ = port_range(1)
    server = listen(port).pid
    fds = sorted(os.listdir(f"/proc/{server}/fd"), key=int)
    real = os.readlink

    def closing(path: Any, *args: Any, **kwargs: Any) -> str:
        if path == f"/proc/{server}/fd/{fds[0]}":  # stdin: closed before it is read
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "readlink", closing)
    assert linux.listeners({port}) == {port: {server}}


def test_out_of_descriptors_reading_a_descriptor_raises(
    listen: Listen, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, _ = port_range(1)
    server = listen(port).pid

    def exhausted(path: Any, *args: Any, **kwargs: Any) -> str:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(os, "readlink", exhausted)
    with pytest.raises(OSError) as raised:
        linux._socket_inodes(server)
    assert raised.value.errno == errno.EMFILE


EXHAUSTED = """
import errno, os, resource, sys
from xumd.system.platform import linux
port, pid = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
for name, call in (
    ("listeners", lambda: linux.listeners({port})),
    ("owned_by", lambda: linux.owned_by({0})),
    ("socket_inodes", lambda: linux._socket_inodes(pid)),
):
    try:
        print(name, "answered", call())
    except OSError as exc:
        print(name, "raised", errno.errorcode[exc.errno])
"""


def test_out_of_descriptors_raises_never_nobody(listen: Listen) -> None:
    port, _ = port_range(1)
    server = listen(port).pid
    done = subprocess.run(
        [sys.executable, "-c", EXHAUSTED, str(port), str(server)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "listeners raised EMFILE",
        "owned_by raised EMFILE",
        "socket_inodes raised EMFILE",
    ]


def test_the_tables_are_read_in_any_order(
    listen: Listen, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The kernel happens to print listening sockets first: a listener after a connected
    socket is found all the same (the table below is the real one, its lines reordered)."""
    port, _ = port_range(1)
    server = listen(port).pid
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10),
        open("/proc/net/tcp", encoding="ascii") as f,
    ):
        header, *lines = f.readlines()
    listening = [line for line in lines if line.split()[3] == "0A"]
    others = [line for line in lines if line.split()[3] != "0A"]
    assert others, "the connection is in the table"
    table = tmp_path / "tcp"
    table.write_text(header + "".join(others + listening))
    monkeypatch.setattr(linux, "_NET_TABLES", (str(table),))
    assert linux.listeners({port}) == {port: {server}}


def test_no_table_is_read_once_every_socket_is_placed(
    listen: Listen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Newest first, and no further: a process older than the listener (here: every one, its
    descriptor table out of reach) is never looked at once the listener's socket is placed."""
    port, _ = port_range(1)
    server = listen(port).pid
    real = os.listdir

    def older_unreadable(path: Any = ".") -> list[str]:
        parts = str(path).split("/")
        if len(parts) == 4 and parts[1] == "proc" and parts[3] == "fd" and int(parts[2]) < server:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(path)

    monkeypatch.setattr(os, "listdir", older_unreadable)
    assert linux.listeners({port}) == {port: {server}}
