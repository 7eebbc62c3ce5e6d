"""Real listening TCP sockets in processes of their own, for the tests of who holds a port
(`listeners` of each platform backend): each started process prints `listening` once its socket
listens and ends when the test does."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

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
"""A listener on (address, port) with SO_REUSEPORT: two of them share a port, each its own
socket."""

Listen = Callable[..., subprocess.Popen[str]]
"""`listen(port, address="127.0.0.1", code=LISTENER, **popen)`: the started process."""


def listening() -> Iterator[Listen]:
    """Yield a starter of listeners; each is ended at the end (its stdin closed first: a forked
    child that shares its socket ends on it too). A listener that cannot listen here (no IPv6)
    skips the test, saying why."""
    started: list[subprocess.Popen[str]] = []

    def start(
        port: int, address: str = "127.0.0.1", *, code: str = LISTENER, **how: Any
    ) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, address, str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **how,
        )
        started.append(proc)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "listening":
            proc.kill()
            proc.wait(timeout=10)
            assert proc.stderr is not None
            pytest.skip(f"cannot listen on {address}: {proc.stderr.read().strip()}")
        return proc

    yield start
    for proc in started:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.kill()
        proc.wait(timeout=10)
