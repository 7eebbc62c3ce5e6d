"""Raw NDJSON over the daemon's socket, and what JSON-RPC 2.0 says must come back.

The fuzz tests send arbitrary bytes; `expected_replies` derives from the bytes alone (split into
frames the way the transport splits them, decoded as JSON) how many responses each request id is
owed, and how many error responses with a null id (parse errors, invalid requests) are owed.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson


@dataclass
class Owed:
    ids: Counter[Any] = field(default_factory=Counter)
    nulls: int = 0


def _valid_id(value: Any) -> bool:
    return value is None or (isinstance(value, int | float | str) and not isinstance(value, bool))


def _owed_for(message: Any, owed: Owed) -> None:
    if not isinstance(message, dict):
        owed.nulls += 1
        return
    if "id" in message:
        if not _valid_id(message["id"]) or message["id"] is None:
            owed.nulls += 1
        else:
            owed.ids[message["id"]] += 1
        return
    params_ok = "params" not in message or isinstance(message["params"], dict | list)
    if (
        message.get("jsonrpc") != "2.0"
        or not isinstance(message.get("method"), str)
        or not params_ok
    ):
        owed.nulls += 1  # an invalid notification is still answered, with a null id


def frames_of(stream: bytes) -> list[bytes]:
    """Frames as the transport cuts them: at each newline; a final piece without one counts."""
    return [piece for piece in stream.split(b"\n") if piece.strip()]


def expected_replies(stream: bytes) -> Owed:
    owed = Owed()
    for frame in frames_of(stream):
        try:
            message = orjson.loads(frame)
        except orjson.JSONDecodeError:
            owed.nulls += 1
            continue
        if isinstance(message, list):
            if not message:
                owed.nulls += 1
            for item in message:
                _owed_for(item, owed)
        else:
            _owed_for(message, owed)
    return owed


def received(messages: list[Any]) -> tuple[Owed, list[dict[str, Any]]]:
    """Responses by id (batches flattened; server notifications skipped), and all responses."""
    got = Owed()
    responses: list[dict[str, Any]] = []
    for message in messages:
        items = message if isinstance(message, list) else [message]
        for item in items:
            if isinstance(item, dict) and "method" in item and "id" not in item:
                continue  # a notification from the server (events), not a response
            assert isinstance(item, dict), f"response is not an object: {item!r}"
            responses.append(item)
            if item.get("id") is None:
                got.nulls += 1
            else:
                got.ids[item["id"]] += 1
    return got, responses


def connect(path: Path, timeout: float = 10.0) -> socket.socket:
    """Connect, retrying while the listen backlog is full: a Unix socket with a timeout gets
    EAGAIN at once, instead of waiting, when the daemon has not accepted the earlier ones yet."""
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
            return sock
        except BlockingIOError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def read_all(sock: socket.socket, timeout: float = 15.0, *, owed: Owed | None = None) -> list[Any]:
    """Every message until the daemon closes the connection; fails (never hangs) past timeout.

    With `owed`, reading also ends once every owed reply is in: a connection that subscribed
    to events stays open after the client's half-close (it keeps receiving events, as
    PROTOCOL.md's socat example needs), so EOF is not owed to it."""
    deadline = time.monotonic() + timeout
    buffer = b""
    while owed is None or not _all_in(buffer, owed):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"daemon did not finish answering within {timeout}s")
        sock.settimeout(left)
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            break
        buffer += chunk
    assert not buffer or buffer.endswith(b"\n"), f"truncated final frame: {buffer[-200:]!r}"
    return [orjson.loads(line) for line in buffer.split(b"\n") if line]


def _all_in(buffer: bytes, owed: Owed) -> bool:
    complete = buffer[: buffer.rfind(b"\n") + 1]
    got, _ = received([orjson.loads(line) for line in complete.split(b"\n") if line])
    return got.nulls >= owed.nulls and all(got.ids[k] >= n for k, n in owed.ids.items())


def exchange(path: Path, chunks: list[bytes], timeout: float = 15.0) -> list[Any]:
    """Send `chunks` (one send each), half-close, and read every answer until EOF (or, where
    the stream may subscribe to events, until every owed reply is in: see `read_all`)."""
    sock = connect(path)
    stream = b"".join(chunks)
    owed = expected_replies(stream) if b"events.subscribe" in stream else None
    try:
        for chunk in chunks:
            sock.sendall(chunk)
        sock.shutdown(socket.SHUT_WR)
        return read_all(sock, timeout, owed=owed)
    finally:
        sock.close()


def status(path: Path, timeout: float = 10.0) -> dict[str, Any]:
    """One daemon.status on a fresh connection, bounded: the daemon is alive and not wedged."""
    sock = connect(path, timeout)
    try:
        sock.sendall(b'{"jsonrpc":"2.0","id":"health","method":"daemon.status"}\n')
        buffer = b""
        deadline = time.monotonic() + timeout
        while not buffer.endswith(b"\n"):
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(1 << 16)
            assert chunk, "daemon closed the health-check connection"
            buffer += chunk
        reply = orjson.loads(buffer)
        assert reply.get("id") == "health" and "result" in reply, reply
        result: dict[str, Any] = reply["result"]
        return result
    finally:
        sock.close()
