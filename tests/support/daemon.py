"""A real xumd process for integration tests.

Readiness is an event, not a sleep: the test passes its own NOTIFY_SOCKET (a datagram socket) and
waits, with a deadline, for the daemon's READY=1 — exactly what systemd would see.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
from xum_client import Client
from xumd.app import RECONCILED

XUMD = [sys.executable, "-m", "xumd"]
XUM = str(Path(sys.executable).parent / "xum")


def short_tmpdir(prefix: str = "xum-") -> Path:
    """A short directory under /tmp: Unix socket paths are limited to 107 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def write_config(root: Path, text: str) -> None:
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    (root / "config.toml").write_text(text)


def serve(
    prefix: str, config: str, *, prepare: Callable[[Path], None] | None = None
) -> Iterator[DaemonProcess]:
    """A daemon started on a new short root with `config` (and whatever `prepare(root)` puts
    there first), closed after: a fixture's body is `yield from serve(...)`."""
    root = short_tmpdir(prefix) / "root"
    if prepare is not None:
        prepare(root)
    write_config(root, config)
    proc = DaemonProcess(root).start()
    try:
        yield proc
    finally:
        proc.close()


def run_xum(
    daemon: DaemonProcess, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`xum --root ROOT ARGS...` against `daemon`, its output captured, never raising on a
    non-zero exit (the tests read it)."""
    return subprocess.run(
        [XUM, "--root", str(daemon.root), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class DaemonProcess:
    def __init__(
        self,
        root: Path,
        *,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        log_level: str = "debug",
        socket_path: Path | None = None,
        launcher: list[str] | None = None,
    ) -> None:
        self.root = root
        self.env = env or {}
        self.args = args or []
        # A command that starts xumd (socket activation tests): it is prepended to the argv.
        self.launcher = launcher or []
        self._socket_path = socket_path
        self.log_level = log_level
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = root.parent / f"{root.name}.xumd.log"
        self._notify_dir = short_tmpdir("xumn-")
        self._notify_path = self._notify_dir / "n"
        self._notify: socket.socket | None = None
        self.notify_messages: list[str] = []

    @property
    def socket_path(self) -> Path:
        return self._socket_path or self.root / "xumd.sock"

    @property
    def notify_path(self) -> Path:
        """The fake NOTIFY_SOCKET this daemon reports READY=1 etc. to."""
        return self._notify_path

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, *, wait_ready: bool = True, timeout: float = 20.0) -> DaemonProcess:
        if self._notify is None:
            self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._notify.bind(str(self._notify_path))
        env = {**os.environ, "NOTIFY_SOCKET": str(self._notify_path), **self.env}
        env.pop("XUM_SOCKET", None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [
                *self.launcher,
                *XUMD,
                "--root",
                str(self.root),
                "--log-level",
                self.log_level,
                *self.args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
        )
        log.close()
        # READY=1, then every record agrees with the disk (with READY=1, or once a root with
        # records built its feature graph: xumd.startup.lazy_start).
        if wait_ready and RECONCILED not in self.wait_for_notify("READY=1", timeout).split("\n"):
            self.wait_for_notify(RECONCILED, timeout)
        return self

    def wait_for_notify(self, field: str, timeout: float = 20.0) -> str:
        assert self._notify is not None
        deadline = time.monotonic() + timeout
        while True:
            for message in self.notify_messages:
                if field in message.split("\n"):
                    self.notify_messages.remove(message)
                    return message
            left = deadline - time.monotonic()
            if left <= 0 or (
                self.proc is not None and self.proc.poll() is not None and not self._pending()
            ):
                raise TimeoutError(
                    f"xumd did not send {field} within {timeout}s "
                    f"(exit={self.proc.poll() if self.proc else None}); "
                    f"log:\n{self.log_text()[-4000:]}"
                )
            self._notify.settimeout(min(left, 0.5))
            try:
                self.notify_messages.append(self._notify.recv(4096).decode())
            except TimeoutError:
                continue

    def _pending(self) -> bool:
        assert self._notify is not None
        self._notify.setblocking(False)
        try:
            self.notify_messages.append(self._notify.recv(4096).decode())
            return True
        except BlockingIOError:
            return False
        finally:
            self._notify.setblocking(True)

    def client(self, **kwargs: Any) -> Client:
        if self._socket_path is not None:
            kwargs.setdefault("socket_path", self._socket_path)
        return Client(self.root, **kwargs)

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        with self.client() as client:
            return client.call(method, params)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def terminate(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self._terminate_signal()
        return self.proc.wait(timeout)

    def _terminate_signal(self) -> None:
        """SIGTERM to the daemon. A launcher that forks (`unshare -T --fork`) ignores SIGTERM
        while it waits for its child, so its children get it too: else every close waited out
        its 15 s and then SIGKILLed the launcher. A launcher that execs (prlimit, `unshare -m`)
        is the daemon itself and has no children here. The children are read while the launcher
        lives and has not reaped them, so none of their pids can have been reused."""
        assert self.proc is not None
        children = psutil.Process(self.proc.pid).children() if self.launcher else []
        self.proc.send_signal(signal.SIGTERM)
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.send_signal(signal.SIGTERM)

    def kill(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(10)

    def restart(self, **kwargs: Any) -> DaemonProcess:
        if self.proc is not None and self.proc.poll() is None:
            self.terminate()
        return self.start(**kwargs)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                self._terminate_signal()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._notify is not None:
            self._notify.close()
            self._notify = None
        shutil.rmtree(self._notify_dir, ignore_errors=True)
