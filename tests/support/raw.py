"""A raw NDJSON peer for protocol tests: bytes in, decoded lines out, every read bounded.

Unlike `xum_client`, it sends exactly the bytes a test gives it (garbage included) and does no
handshake, which is what `echo '...' | socat - UNIX-CONNECT:ROOT/xumd.sock` does too.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any


class RawPeer:
    def __init__(self, socket_path: Path | str, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(socket_path))
        self.timeout = timeout
        self._buffer = b""

    def send(self, data: bytes | str) -> None:
        self.sock.sendall(data.encode() if isinstance(data, str) else data)

    def send_json(self, message: Any) -> None:
        self.send(json.dumps(message) + "\n")

    def shut_write(self) -> None:
        """Half-close: the daemon sees EOF, answers what it read, then closes."""
        self.sock.shutdown(socket.SHUT_WR)

    def read_line(self, timeout: float | None = None) -> bytes | None:
        """The next line (without its newline), or None at EOF."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no complete line from the daemon in time")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                if self._buffer:
                    raise AssertionError(f"EOF inside a line: {self._buffer[:200]!r}")
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def read(self, timeout: float | None = None) -> Any:
        line = self.read_line(timeout)
        if line is None:
            raise AssertionError("the daemon closed the connection")
        return json.loads(line)

    def read_all(self, timeout: float | None = None) -> list[Any]:
        """Every message until the daemon closes the connection."""
        messages = []
        while (line := self.read_line(timeout)) is not None:
            messages.append(json.loads(line))
        return messages

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def exchange(socket_path: Path | str, data: bytes | str, timeout: float = 10.0) -> list[Any]:
    """One socat-style exchange: connect, send, half-close, read every answer until EOF."""
    with RawPeer(socket_path, timeout) as peer:
        peer.send(data)
        peer.shut_write()
        return peer.read_all()


def first_calls_together(socket_path: Path | str, methods: list[str]) -> list[Any]:
    """Each of `methods` on a connection of its own, all sent at once (a barrier between the
    threads), and their replies in the same order: the first requests of something built at
    its first use, which must be built once whoever asks first."""
    peers = [RawPeer(socket_path, timeout=30) for _ in methods]
    go = threading.Barrier(len(peers))
    replies: list[Any] = [None] * len(peers)

    def first_call(i: int) -> None:
        go.wait(timeout=30)
        peers[i].send_json({"jsonrpc": "2.0", "id": i, "method": methods[i], "params": {}})
        replies[i] = peers[i].read(timeout=30)

    threads = [threading.Thread(target=first_call, args=(i,)) for i in range(len(peers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for peer in peers:
        peer.close()
    assert [reply["id"] for reply in replies] == list(range(len(peers))), replies
    return replies


def ask(socket_path: Path | str, method: str, params: Any = None, request_id: int = 1) -> Any:
    """One request on a connection of its own (no handshake), its raw reply: an error object
    or a result, as any peer would read it. `params` None sends none."""
    with RawPeer(socket_path, timeout=30) as peer:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        peer.send_json(message)
        return peer.read(timeout=30)
