"""Start the measured processes: a real xumd, and the bare echo server it is compared with.

Both announce readiness the systemd way (READY=1 on NOTIFY_SOCKET), so "time to ready" is measured
identically for both: from spawn to the datagram.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil


def short_dir(prefix: str) -> Path:
    """A short directory under /tmp: a Unix socket path holds at most 107 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


class Launched:
    """One child process that sends READY=1; stopped with SIGTERM (bounded), then SIGKILL."""

    def __init__(self, argv: list[str], socket_path: Path, env: dict[str, str] | None = None):
        self.argv = argv
        self.socket_path = socket_path
        self._env = env or {}
        self._notify_dir = short_dir("xbn-")
        self._notify_path = self._notify_dir / "n"
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind(str(self._notify_path))
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_s: float | None = None
        self.reconciled_s: float | None = None
        self._started = 0.0
        self.log_path = self._notify_dir / "log"

    def start(self, timeout: float = 60.0) -> Launched:
        env = {**os.environ, "NOTIFY_SOCKET": str(self._notify_path), **self._env}
        env.pop("XUM_SOCKET", None)
        with open(self.log_path, "ab") as log:
            self._started = time.perf_counter()
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )
        self.ready_s = self._seconds_to("READY=1", timeout)
        return self

    def wait_reconciled(self, timeout: float = 60.0) -> float:
        """Seconds from spawn to XUM_RECONCILED=1 (xumd: every record agrees with the disk; a
        root with records says it once its feature graph ran its startup passes, after
        READY=1)."""
        if self.reconciled_s is None:
            self.reconciled_s = self._seconds_to("XUM_RECONCILED=1", timeout)
        return self.reconciled_s

    def _seconds_to(self, field: str, timeout: float) -> float:
        """Seconds from spawn to the next notify datagram carrying `field`; the process is
        stopped and its log raised when it exits or `timeout` passes first."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                said = self.log_path.read_text(errors="replace")[-2000:]  # stop() removes it
                self.stop()
                raise RuntimeError(
                    f"{self.argv[:3]}: no {field} within {timeout}s (exit {self.proc.returncode}): "
                    + said
                )
            self._notify.settimeout(min(left, 0.5))
            try:
                message = self._notify.recv(4096).decode()
            except TimeoutError:
                continue
            if field in message.split("\n"):
                return time.perf_counter() - self._started

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss_bytes(self) -> int:
        return int(psutil.Process(self.pid).memory_info().rss)

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._notify.close()
        shutil.rmtree(self._notify_dir, ignore_errors=True)
        return self.proc.returncode if self.proc is not None else None


def xumd(root: Path, *, log_level: str = "warning", env: dict[str, str] | None = None) -> Launched:
    argv = [sys.executable, "-m", "xumd", "--root", str(root), "--log-level", log_level]
    return Launched(argv, root / "xumd.sock", env)


def echo_server(socket_path: Path, payload: Path | None = None) -> Launched:
    argv = [sys.executable, "-m", "bench.echo", str(socket_path)]
    if payload is not None:
        argv.append(str(payload))
    return Launched(argv, socket_path, {"PYTHONPATH": repo_path()})


def repo_path() -> str:
    """PYTHONPATH for a child that imports the bench package."""
    here = Path(__file__).resolve().parent.parent
    existing = os.environ.get("PYTHONPATH")
    return f"{here}{os.pathsep}{existing}" if existing else str(here)
