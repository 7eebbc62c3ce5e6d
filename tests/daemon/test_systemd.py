"""systemd integration: socket activation end to end, and the unit files themselves.

Socket activation runs twice: through the real `systemd-socket-activate` (skipped, saying so, when
it is not installed), and through a tiny Python launcher that does exactly what sd_listen_fds(3)
expects (bind, listen, fd 3, LISTEN_FDS=1, LISTEN_PID=<the pid after exec>, exec xumd), so the
code path is covered on every machine.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from xum_client import units

from tests.support.daemon import DaemonProcess
from tests.support.raw import RawPeer
from tests.support.wait import until

REPO = Path(__file__).resolve().parents[2]
STATUS = {"jsonrpc": "2.0", "method": "daemon.status", "id": "activated"}

LAUNCHER = r"""
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
s.listen(16)
if s.fileno() != 3:
    os.dup2(s.fileno(), 3)  # the copy is inheritable
else:
    os.set_inheritable(3, True)
os.environ["LISTEN_FDS"] = "1"
os.environ["LISTEN_PID"] = os.environ.get("FAKE_LISTEN_PID") or str(os.getpid())
os.execv(sys.argv[2], sys.argv[2:])
"""


def python_launcher(sock: Path) -> list[str]:
    return [sys.executable, "-c", LAUNCHER, str(sock)]


def _listening_peer(sock: Path) -> RawPeer | None:
    try:
        return RawPeer(sock, timeout=20)
    except (FileNotFoundError, ConnectionRefusedError):
        return None


def check_activated(daemon: DaemonProcess, sock: Path) -> None:
    # The launcher owns the listening socket before xumd exists: connecting first is fine
    # (systemd-socket-activate even waits for this connection to exec xumd).
    # The file appears at bind(), a moment before listen(): a connect in between is refused.
    with until(lambda: _listening_peer(sock), message="the launcher to listen") as peer:
        peer.send_json(STATUS)
        daemon.wait_for_notify("READY=1")
        result = peer.read()["result"]
    assert result["pid"] == daemon.pid  # exec kept the launcher's pid
    assert result["root"] == str(daemon.root)
    assert '"activated": true' in daemon.log_text()
    assert not (daemon.root / "xumd.sock").exists()  # it did not bind a socket of its own
    assert daemon.terminate() == 0
    # The socket belongs to whoever passed it (the socket unit): xumd leaves it in place.
    assert sock.exists()


@pytest.mark.skipif(
    shutil.which("systemd-socket-activate") is None,
    reason="systemd-socket-activate is not installed (Debian: package systemd)",
)
def test_socket_activation_with_systemd_socket_activate(tmp_short: Path) -> None:
    sock = tmp_short / "a.sock"
    daemon = DaemonProcess(tmp_short / "root", socket_path=sock)
    # It passes only a minimal environment on: NOTIFY_SOCKET has to be named.
    daemon.launcher = [
        "systemd-socket-activate",
        "--listen",
        str(sock),
        "-E",
        f"NOTIFY_SOCKET={daemon.notify_path}",
    ]
    daemon.start(wait_ready=False)
    try:
        check_activated(daemon, sock)
    finally:
        daemon.close()


def test_socket_activation_with_an_sd_listen_fds_launcher(tmp_short: Path) -> None:
    sock = tmp_short / "a.sock"
    daemon = DaemonProcess(tmp_short / "root", socket_path=sock, launcher=python_launcher(sock))
    daemon.start(wait_ready=False)
    try:
        check_activated(daemon, sock)
    finally:
        daemon.close()


def test_listen_fds_for_another_pid_is_ignored(tmp_short: Path) -> None:
    sock = tmp_short / "a.sock"
    daemon = DaemonProcess(
        tmp_short / "root", launcher=python_launcher(sock), env={"FAKE_LISTEN_PID": "1"}
    ).start()
    try:
        assert daemon.call("daemon.status")["pid"] == daemon.pid  # on ROOT/xumd.sock
        assert '"activated": false' in daemon.log_text()
    finally:
        daemon.close()


def test_a_foreign_listener_on_the_socket_path_is_not_stolen(tmp_short: Path) -> None:
    root = tmp_short / "root"
    root.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(root / "xumd.sock"))
    listener.listen(1)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "xumd", "--root", str(root)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 4, done.stderr
        assert "xumd.socket" in done.stderr
        assert (root / "xumd.sock").exists()
    finally:
        listener.close()


# -- the unit files ---------------------------------------------------------------------------


def test_repository_units_are_up_to_date() -> None:
    for name, text in units.repository_files().items():
        path = REPO / "systemd" / name
        assert path.exists() and path.read_text() == text, (
            f"systemd/{name} is stale: run `make units`"
        )


def analyze_verify(
    files: list[Path], home: Path, runtime: Path
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}
    env.pop("XDG_STATE_HOME", None)
    env.pop("XDG_CONFIG_HOME", None)
    return subprocess.run(
        ["systemd-analyze", "--user", "verify", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_has_no_warnings(tmp_short: Path) -> None:
    # %h/.local/bin/xumd must exist for verify: a fake home pointing at this checkout's xumd.
    home = tmp_short / "home"
    (home / ".local" / "bin").mkdir(parents=True)
    xumd = Path(sys.executable).parent / "xumd"
    assert xumd.exists()
    (home / ".local" / "bin" / "xumd").symlink_to(xumd)
    runtime = tmp_short / "run"
    runtime.mkdir(mode=0o700)
    unit_dir = tmp_short / "units"
    unit_dir.mkdir()
    for name in (units.SERVICE_NAME, units.SOCKET_NAME):
        shutil.copy(REPO / "systemd" / name, unit_dir / name)
    files = [unit_dir / units.SERVICE_NAME, unit_dir / units.SOCKET_NAME]
    done = analyze_verify(files, home, runtime)
    # verify exits 0 on unknown keys and other warnings: its stderr must be empty too.
    assert done.returncode == 0 and done.stderr == "", done.stderr
    # The check can fail: a unit with an unknown key is reported.
    with (unit_dir / units.SERVICE_NAME).open("a") as unit:
        unit.write("NoSuchKey=1\n")
    bad = analyze_verify(files, home, runtime)
    assert "NoSuchKey" in bad.stderr


def test_service_unit_has_the_required_settings() -> None:
    text = units.render_service()
    for line in (
        "Type=notify",
        "KillMode=mixed",
        "Restart=on-failure",
        f"WatchdogSec={units.WATCHDOG_S}",
        "NoNewPrivileges=yes",
    ):
        assert f"\n{line}\n" in text
    assert "ProtectHome" not in text.replace("(ProtectHome", "")  # checkouts live in $HOME
