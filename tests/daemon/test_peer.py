"""A peer of another uid is refused (SO_PEERCRED), even when it can reach the socket.

The test runs the daemon as root with its socket in a test directory (mode 0711) and widens the
socket's mode itself, so that `nobody` can connect at all: the only thing left to refuse it is the
peer-credential check, which is what this tests. (In real use the 0700 root and the 0600 socket
already keep other users out; the check is defence in depth.) The `nobody` side is a real
subprocess whose uid/gid are dropped before it starts; credentials are taken at connect time.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess

NOBODY = 65534

HELPER = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
s.connect(sys.argv[1])
try:
    s.sendall(b'{"jsonrpc": "2.0", "method": "daemon.status", "id": 1}\n')
    s.shutdown(socket.SHUT_WR)
except BrokenPipeError:
    pass  # refused peers are closed at once; what the daemon said is still readable
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
print(json.dumps({"uid": __import__("os").getuid(), "lines": data.decode().splitlines()}))
"""

pytestmark = [
    pytest.mark.skipif(not hasattr(socket, "SO_PEERCRED"), reason="SO_PEERCRED is Linux-only"),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="dropping to another uid needs root (tests run as root in CI)"
    ),
]


def world_python() -> str | None:
    """An interpreter `nobody` can run (the test's own may live under a 0700 home)."""
    for candidate in (
        "/usr/bin/python3",
        "/usr/local/bin/python3",
        os.path.realpath(sys.executable),
    ):
        path = Path(candidate)
        if path.exists() and all(p.stat().st_mode & 0o001 for p in [*path.parents, path]):
            return candidate
    return None


def run_helper(sock: Path, *, as_nobody: bool) -> dict[str, object]:
    python = world_python()
    if python is None:
        pytest.skip("no Python interpreter that the nobody user can execute")
    kwargs: dict[str, object] = {}
    if as_nobody:
        kwargs = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    done = subprocess.run(
        [python, "-I", "-c", HELPER, str(sock)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        **kwargs,  # type: ignore[arg-type]
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_other_uid_is_refused(tmp_short: Path) -> None:
    os.chmod(tmp_short, 0o711)
    sock = tmp_short / "s.sock"
    daemon = DaemonProcess(tmp_short / "root", args=["--socket", str(sock)]).start()
    try:
        os.chmod(sock, 0o666)
        # Control: the helper itself works when it runs as the daemon's own uid.
        mine = run_helper(sock, as_nobody=False)
        assert json.loads(mine["lines"][0])["result"]["pid"] == daemon.pid  # type: ignore[index]
        other = run_helper(sock, as_nobody=True)
        assert other["uid"] == NOBODY
        lines = other["lines"]
        assert isinstance(lines, list) and len(lines) == 1, lines
        error = json.loads(lines[0])["error"]
        assert error["data"]["kind"] == "permission_denied"
        assert error["code"] == -32016
        assert "peer_refused" in daemon.log_text()
        assert f'"peer_uid": {NOBODY}' in daemon.log_text()
        # The daemon is unaffected.
        with daemon.client(socket_path=sock) as client:
            assert client.call("daemon.status")["pid"] == daemon.pid
    finally:
        daemon.close()
