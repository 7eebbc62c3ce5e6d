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


def _xumd_by_environment(root: Path, level: str) -> list[dict[str, object]]:
    """A real xumd started with XUM_LOG_LEVEL (no --log-level), asked one daemon.status, then
    stopped: its log lines."""
    from tests.support.wait import until

    root.mkdir(mode=0o700)
    log_path = root.parent / "env-level.log"
    env = {**os.environ, "XUM_LOG_LEVEL": level}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "xumd", "--root", str(root)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
        )
    try:
        until(lambda: b'"daemon.ready"' in log_path.read_bytes(), message="daemon.ready")
        exchange(root / "xumd.sock", '{"jsonrpc": "2.0", "method": "daemon.status", "id": 1}\n')
        proc.terminate()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=20)
    return json_lines(log_path.read_text())


def test_log_level_from_the_environment_any_case(tmp_short: Path) -> None:
    records = _xumd_by_environment(tmp_short / "root", "DEBUG")
    assert any(r["event"] == "rpc.request" for r in records)  # debug lines: the level took
    assert not any(r["event"] == "daemon.log_level_unknown" for r in records)


def test_an_unknown_log_level_in_the_environment_is_said(tmp_short: Path) -> None:
    records = _xumd_by_environment(tmp_short / "root", "verbose")
    warned = [r for r in records if r["event"] == "daemon.log_level_unknown"]
    assert warned and warned[0]["value"] == "verbose" and warned[0]["using"] == "info"
    assert not any(r["event"] == "rpc.request" for r in records)  # info: no debug lines
