"""sd_notify without libsystemd: one datagram to $NOTIFY_SOCKET per state change."""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        self.address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        usec = os.environ.get("WATCHDOG_USEC")
        watchdog_pid = os.environ.get("WATCHDOG_PID")
        self.watchdog_s: float | None = None
        if usec and usec.isdigit() and (watchdog_pid in (None, "", str(os.getpid()))):
            self.watchdog_s = int(usec) / 1_000_000

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *fields: str) -> bool:
        if not self.address:
            return False
        target = self.address
        # A leading '@' names an abstract socket.
        addr: str | bytes = "\0" + target[1:] if target.startswith("@") else target
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            try:
                sock.connect(addr)
                sock.sendall("\n".join(fields).encode())
            except OSError:
                return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.send(
            "READY=1", f"MAINPID={os.getpid()}", *([f"STATUS={status}"] if status else [])
        )

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")
