"""Logs: JSON lines off a TTY, console format on a TTY, --log-level, a debug line per request."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from tests.support.daemon import DaemonProcess
from tests.support.raw import exchange


def json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_json_lines_and_a_debug_line_per_request(root: Path) -> None:
    daemon = DaemonProcess(root, log_level="debug").start()
    try:
        exchange(
            daemon.socket_path,
            '{"jsonrpc": "2.0", "method": "daemon.status", "id": 1}\n'
            '{"jsonrpc": "2.0", "method": "hello", "params": {"protocol": "9.0"}, "id": 2}\n',
        )
        daemon.terminate()
        records = json_lines(daemon.log_text())  # every line is one JSON object
    finally:
        daemon.close()
    assert all({"event", "level", "timestamp", "logger"} <= set(r) for r in records)
    requests = [r for r in records if r["event"] == "rpc.request"]
    by_method = {r["method"]: r for r in requests}
    assert by_method["daemon.status"]["outcome"] == "ok"
    assert by_method["hello"]["outcome"] == "protocol_mismatch"
    for record in requests:
        assert record["level"] == "debug"
        assert isinstance(record["duration_ms"], float | int)
    assert any(r["event"] == "daemon.ready" for r in records)


def test_log_level_info_hides_request_lines(root: Path) -> None:
    daemon = DaemonProcess(root, log_level="info").start()
    try:
        daemon.call("daemon.status")
        daemon.terminate()
        records = json_lines(daemon.log_text())
    finally:
        daemon.close()
    assert not [r for r in records if r["event"] == "rpc.request"]
    assert [r for r in records if r["event"] == "daemon.stopped"]


def test_console_format_on_a_tty(tmp_short: Path) -> None:
    primary, secondary = pty.openpty()
    root = tmp_short / "root"
    proc = subprocess.Popen(
        [sys.executable, "-m", "xumd", "--root", str(root), "--log-level", "info"],
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
        env={**os.environ, "NO_COLOR": "1"},
    )
    os.close(secondary)
    output = b""
    try:
        deadline = time.monotonic() + 20
        while b"daemon.ready" not in output and time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 0.5)
            if ready:
                try:
                    output += os.read(primary, 65536)
                except OSError:
                    break
    finally:
        proc.terminate()
        proc.wait(20)
        os.close(primary)
    text = output.decode(errors="replace")
    assert "daemon.ready" in text, text
    line = next(line for line in text.splitlines() if "daemon.ready" in line)
    assert not line.lstrip().startswith("{")  # console renderer, not JSON


def test_log_format_can_be_forced(root: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "xumd",
            "--root",
            str(root / "x" / ("d" * 120)),
            "--log-format",
            "console",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 4
    assert "daemon.start_failed" in done.stderr
    assert not any(line.startswith("{") for line in done.stderr.splitlines())
