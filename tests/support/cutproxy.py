"""A proxy between a client and the daemon's socket that cuts the connection right after it has
forwarded a chosen request: the request reached the daemon, its answer never reaches the client
(what a dropped link does to a call in flight: `connection_lost` with `sent: true`)."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path


class CuttingProxy:
    def __init__(self, listen: Path, upstream: Path, cut_after: bytes) -> None:
        """Listen at `listen`; forward each connection to `upstream`; the first time a
        forwarded line from a client holds `cut_after`, close both ends of that connection
        (nothing more is forwarded on it). Later connections are forwarded whole."""
        self.listen = listen
        self.upstream = upstream
        self.cut_after = cut_after
        self.cut = threading.Event()
        """Set once a connection was cut after forwarding the request."""
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(listen))
        self._server.listen(4)
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            up.connect(str(self.upstream))
            mine = threading.Event()
            for target in (self._up, self._down):
                thread = threading.Thread(target=target, args=(client, up, mine), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _up(self, client: socket.socket, up: socket.socket, mine: threading.Event) -> None:
        buffer = b""
        with contextlib.suppress(OSError):
            while chunk := client.recv(65536):
                up.sendall(chunk)
                buffer += chunk
                lines = buffer.split(b"\n")
                buffer = lines.pop()
                if not self.cut.is_set() and any(self.cut_after in line for line in lines):
                    mine.set()
                    self.cut.set()
                    break
        for sock in (client, up):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _down(self, client: socket.socket, up: socket.socket, mine: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while chunk := up.recv(65536):
                if mine.is_set():
                    return
                client.sendall(chunk)

    def close(self) -> None:
        self._server.close()
        for thread in self._threads:
            thread.join(10)

    def __enter__(self) -> CuttingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
