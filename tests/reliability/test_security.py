"""Security: other uids cannot use the daemon; no argv the daemon builds goes through a shell;
setup/teardown scripts never run untrusted (see test_hostile_lifecycle.py for that one)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability import wire
from tests.reliability.budget import size
from tests.reliability.shellcheck import check_source, check_tree
from tests.support.daemon import DaemonProcess

pytestmark = pytest.mark.reliability

DAEMON_PACKAGE = Path(__file__).resolve().parents[2] / "daemon" / "xumd"
NOBODY = 65534


def test_no_shell_in_the_daemon() -> None:
    findings = check_tree(DAEMON_PACKAGE)
    assert not findings, "\n".join(str(f) for f in findings)


def test_sh_c_only_in_the_script_runner() -> None:
    runner = DAEMON_PACKAGE / "lifecycle" / "scripts.py"
    if not runner.exists():
        pytest.skip("the trusted-script runner has not landed")
    assert '"-c"' in runner.read_text(), "the script runner no longer uses sh -c: update the check"


@pytest.mark.parametrize(
    "source",
    [
        "import subprocess\ndef f(cmd):\n    subprocess.run(cmd, shell=True)\n",
        "import subprocess\ndef f(x):\n    subprocess.Popen('ls ' + x)\n",
        "import anyio\nasync def f(x):\n    await anyio.open_process(f'git {x}')\n",
        "import anyio\nasync def f(x):\n    c = 'git ' + x\n    await anyio.open_process(c)\n",
        "import os\ndef f(x):\n    os.system(x)\n",
        "async def f(x):\n    await run_command(['/bin/sh', '-c', x], timeout_s=1)\n",
        "import asyncio\nasync def f(x):\n    await asyncio.create_subprocess_shell(x)\n",
    ],
)
def test_shell_check_can_fail(source: str) -> None:
    assert check_source(source, "xumd/elsewhere.py"), source


def test_shell_check_accepts_argv() -> None:
    ok = (
        "import anyio, subprocess\n"
        "async def f(argv, x):\n"
        "    await anyio.open_process(list(argv))\n"
        "    subprocess.Popen(['git', '-C', x, 'status'], shell=False)\n"
        "    await run_command(['/bin/sh', '-c', x], timeout_s=1)\n"
    )
    assert check_source(ok, "xumd/lifecycle/scripts.py") == []


def _world_python() -> str | None:
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        path = Path(candidate)
        if path.exists() and all(p.stat().st_mode & 0o001 for p in [*path.parents, path]):
            return candidate
    return None


NOBODY_CLIENT = r"""
import json, socket, sys
results = {"refused_fs": 0, "refused_peer": 0, "served": 0, "other": []}
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect(sys.argv[1])
    except PermissionError:
        results["refused_fs"] += 1
        s.close()
        continue
    try:
        s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"daemon.status"}\n')
    except OSError:
        pass
    data = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    s.close()
    if b'"permission_denied"' in data and b'"result"' not in data:
        results["refused_peer"] += 1
    elif b'"result"' in data:
        results["served"] += 1
    else:
        results["other"].append(data.decode(errors="replace")[:200])
print(json.dumps(results))
"""


def _as_nobody(sock: Path, count: int) -> dict[str, object]:
    python = _world_python()
    if python is None:
        pytest.skip("no interpreter the nobody user can run")
    done = subprocess.run(
        [python, "-I", "-c", NOBODY_CLIENT, str(sock), str(count)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not hasattr(socket, "SO_PEERCRED"),
    reason="needs root (to become another uid) and SO_PEERCRED",
)


@needs_root
def test_other_uid_cannot_reach_the_default_socket(daemon: DaemonProcess) -> None:
    result = _as_nobody(daemon.socket_path, size(50, 10))
    assert result["served"] == 0
    assert result["refused_fs"] == size(50, 10), result


@needs_root
def test_other_uid_refused_by_peer_check_under_a_burst(tmp_short: Path) -> None:
    """Defence in depth: with the socket reachable, the SO_PEERCRED check refuses every
    connection of a burst from another uid, and the owner is served all along."""
    exposed = tmp_short / "pub"
    exposed.mkdir(mode=0o755)
    os.chmod(tmp_short, 0o755)
    sock = exposed / "s.sock"
    proc = DaemonProcess(tmp_short / "root", args=["--socket", str(sock)]).start()
    try:
        os.chmod(sock, 0o666)
        count = size(300, 60)
        result = _as_nobody(sock, count)
        assert result["served"] == 0, result
        assert result["refused_peer"] == count, result
        status = wire.status(sock)
        assert status["pid"] == proc.pid
        assert status["connections"] == 1, "refused peers left connections behind"
    finally:
        proc.close()
        os.chmod(tmp_short, 0o700)
    assert sys.platform.startswith("linux")
