"""The `xum` CLI for processes: run (stream, stdin, exit code), ps, kill, lease ls, term."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes.test_support import insert_workspace
from tests.support.daemon import DaemonProcess
from tests.support.terminal import run_on_a_terminal

XUM = [sys.executable, "-c", "from xum_client.cli import main; main()"]


@pytest.fixture
def ws(daemon: DaemonProcess, tmp_short: Path) -> str:
    daemon.terminate()
    workspace = insert_workspace(daemon.root, tmp_short / "checkouts" / "cli-ws")
    daemon.start()
    return workspace


def xum(daemon: DaemonProcess, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XUM_ROOT": str(daemon.root)}
    return subprocess.run(
        [*XUM, *args], input=stdin, capture_output=True, text=True, env=env, timeout=60
    )


def test_run_streams_forwards_stdin_and_exits_with_the_code(daemon: DaemonProcess, ws: str) -> None:
    done = xum(daemon, "run", ws, "--", "sh", "-c", "echo start; cat; exit 7", stdin="hello\n")
    assert done.returncode == 7, done.stderr
    assert done.stdout == "start\nhello\n"
    by_name = xum(daemon, "run", "cli-ws", "--", "sh", "-c", "kill -TERM $$")
    assert by_name.returncode == 128 + 15


def test_ps_kill_and_lease_ls(daemon: DaemonProcess, ws: str) -> None:
    proc = daemon.call(
        "process.spawn", {"workspace_id": ws, "kind": "agent", "argv": ["sleep", "60"]}
    )["process"]
    listed = xum(daemon, "ps")
    assert proc["id"] in listed.stdout and "sleep 60" in listed.stdout
    leases = xum(daemon, "lease", "ls", ws)
    assert str(proc["pid"]) in leases.stdout and "agent" in leases.stdout
    killed = xum(daemon, "kill", proc["id"], "--grace", "0.2")
    assert killed.returncode == 0 and "exited" in killed.stdout
    assert proc["id"] not in xum(daemon, "ps").stdout
    missing = xum(daemon, "kill", "proc_" + "0" * 16)
    assert missing.returncode == 3 and "not found" in missing.stderr


def test_term_is_an_interactive_pty(daemon: DaemonProcess, ws: str) -> None:
    code, _ = run_on_a_terminal(
        [*XUM, "term", ws, "--shell", "/bin/sh"],
        {**os.environ, "XUM_ROOT": str(daemon.root)},
        b"tty >/dev/null && echo hi-$((1+2)); exit 5\n",
        b"hi-3",
        30,
    )
    assert code == 5
