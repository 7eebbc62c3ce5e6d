"""Blocking client: one socket, one request at a time; notifications are queued for the caller."""

from __future__ import annotations

import itertools
import os
import socket
from collections import deque
from pathlib import Path
from types import TracebackType
from typing import Any

from xum_protocol import framing
from xum_protocol.version import PROTOCOL_VERSION

from xum_client.errors import ConnectionLost, DaemonNotRunning, from_error_object


def default_root() -> Path:
    env = os.environ.get("XUM_ROOT")
    if env:
        return Path(env)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "xum"


def socket_path_for(root: Path | str | None = None) -> Path:
    if root is None and os.environ.get("XUM_SOCKET"):
        return Path(os.environ["XUM_SOCKET"])
    return Path(root or default_root()) / "xumd.sock"


class Client:
    def __init__(
        self,
        root: Path | str | None = None,
        *,
        socket_path: Path | str | None = None,
        timeout: float | None = 60.0,
        handshake: bool = True,
        client_name: str = "xum-client",
    ) -> None:
        self.root = str(root or default_root())
        self.socket_path = str(socket_path or socket_path_for(root))
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(self.socket_path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            self._sock.close()
            raise DaemonNotRunning(self.root, self.socket_path, exc.strerror or str(exc)) from None
        self._file = self._sock.makefile("rb")
        self._ids = itertools.count(1)
        self.notifications: deque[dict[str, Any]] = deque()
        self.server: dict[str, Any] | None = None
        if handshake:
            self.server = self.call(
                "hello", {"protocol": PROTOCOL_VERSION, "client": {"name": client_name}}
            )

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": request_id}
        if params is not None:
            message["params"] = params
        self._sock.sendall(framing.encode(message))
        while True:
            reply = self.read_message()
            if isinstance(reply, dict) and "method" in reply and "id" not in reply:
                self.notifications.append(reply)
                continue
            if not isinstance(reply, dict) or reply.get("id") != request_id:
                raise ConnectionLost(f"unexpected reply: {reply!r}")
            if "error" in reply:
                raise from_error_object(reply["error"])
            result: dict[str, Any] = reply["result"]
            return result

    def read_message(self) -> Any:
        line = self._file.readline()
        if not line:
            raise ConnectionLost("the daemon closed the connection")
        return framing.decode(line)

    def next_notification(self) -> dict[str, Any]:
        if self.notifications:
            return self.notifications.popleft()
        message = self.read_message()
        if not isinstance(message, dict):
            raise ConnectionLost(f"unexpected message: {message!r}")
        return message

    def close(self) -> None:
        self._file.close()
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
