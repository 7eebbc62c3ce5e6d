"""The daemon process: one per root, clean exit, restart after SIGKILL."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import DaemonProcess


def test_status_answers(daemon: DaemonProcess) -> None:
    status = daemon.call("daemon.status")
    assert status["pid"] == daemon.pid
    assert status["root"] == str(daemon.root)
    assert status["protocol"] == "1.5"


def test_root_and_socket_modes(daemon: DaemonProcess) -> None:
    assert stat.S_IMODE(daemon.root.stat().st_mode) == 0o700
    mode = daemon.socket_path.stat().st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


def test_second_daemon_refused_naming_the_first(daemon: DaemonProcess) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "xumd", "--root", str(daemon.root)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 3
    assert f"pid {daemon.pid}" in done.stderr
    # The first daemon still serves on its socket.
    assert daemon.call("daemon.status")["pid"] == daemon.pid


def test_sigterm_exits_zero_and_removes_socket(daemon: DaemonProcess) -> None:
    assert daemon.terminate() == 0
    assert not daemon.socket_path.exists()


def test_shutdown_method_answers_then_stops(daemon: DaemonProcess) -> None:
    assert daemon.call("daemon.shutdown") == {"stopping": True}
    assert daemon.wait() == 0
    assert not daemon.socket_path.exists()


def test_restart_after_sigkill(daemon: DaemonProcess) -> None:
    first = daemon.pid
    assert daemon.kill() == -signal.SIGKILL
    assert daemon.socket_path.exists()  # stale socket left behind by the crash
    daemon.start()
    assert daemon.pid != first
    assert daemon.call("daemon.status")["pid"] == daemon.pid


def test_too_long_socket_path_is_a_clear_error(tmp_short: Path) -> None:
    deep = tmp_short / ("d" * 60) / ("e" * 60)
    done = subprocess.run(
        [sys.executable, "-m", "xumd", "--root", str(deep)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 4
    assert "107-byte limit" in done.stderr
    assert "--socket" in done.stderr


def test_socket_option_serves_a_deep_root(tmp_short: Path) -> None:
    deep = tmp_short / ("d" * 60) / ("e" * 60)
    sock = tmp_short / "s.sock"
    proc = DaemonProcess(deep, args=["--socket", str(sock)]).start()
    try:
        from xum_client import Client

        with Client(deep, socket_path=sock) as client:
            assert client.call("daemon.status")["root"] == str(deep)
    finally:
        proc.close()
    assert not sock.exists()


def test_newer_schema_refused(root: Path) -> None:
    import sqlite3

    root.mkdir(mode=0o700)
    db = sqlite3.connect(root / "state.db")
    db.execute("PRAGMA user_version=9999")
    db.close()
    done = subprocess.run(
        [sys.executable, "-m", "xumd", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 4
    assert "newer xumd" in done.stderr
    db = sqlite3.connect(root / "state.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == 9999


def test_list_fault_points_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "xumd", "--list-fault-points"], capture_output=True, text=True
    )
    assert done.returncode == 0


def test_unknown_fault_point_refused(root: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "xumd", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "XUM_FAULT": "no.such.point"},
    )
    assert done.returncode == 4
    assert "no.such.point" in done.stderr


def test_version_and_help() -> None:
    version = subprocess.run(
        [sys.executable, "-m", "xumd", "--version"], capture_output=True, text=True, timeout=30
    )
    assert version.returncode == 0 and version.stdout.startswith("xumd ")
    help_text = subprocess.run(
        [sys.executable, "-m", "xumd", "--help"], capture_output=True, text=True, timeout=30
    )
    assert help_text.returncode == 0
    for option in ("--root", "--socket", "--log-level", "--list-fault-points"):
        assert option in help_text.stdout


def test_fault_points_are_listed_one_per_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "xumd", "--list-fault-points"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    names = done.stdout.splitlines()
    assert names == sorted(set(names))
    assert all(name and " " not in name and "." in name for name in names)


def test_root_from_xdg_state_home(tmp_short: Path) -> None:
    state = tmp_short / "state"
    env = {"XDG_STATE_HOME": str(state)}
    proc = DaemonProcess(state / "xum", env=env)
    proc.args = []
    # Started without --root: the launcher below drops it, so the default must be used.
    proc.launcher = [sys.executable, "-c", _DROP_ROOT]
    proc.start()
    try:
        assert proc.call("daemon.status")["root"] == str(state / "xum")
        assert stat.S_IMODE((state / "xum").stat().st_mode) == 0o700
    finally:
        proc.close()


# Runs `python -m xumd` with the `--root X` pair removed from its argv.
_DROP_ROOT = (
    "import os, sys\n"
    "argv = sys.argv[1:]\n"
    "i = argv.index('--root')\n"
    "del argv[i:i + 2]\n"
    "os.environ.pop('XUM_ROOT', None)\n"
    "os.execv(argv[0], argv)\n"
)
