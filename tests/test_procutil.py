"""xumd.procutil: the one way the daemon runs a command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import anyio
import pytest
from xumd import procutil
from xumd.procutil import CommandNotFound, run_command

from tests.support.procs import alive, identify
from tests.support.wait import until


def test_exit_code_and_merged_output() -> None:
    result = anyio.run(
        lambda: run_command(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout_s=10)
    )
    assert result.returncode == 3
    assert result.output.text() == "out\nerr\n"
    assert not result.ok


def test_output_is_bounded_keeping_head_and_tail() -> None:
    script = "import sys; sys.stdout.write('H' * 100 + 'x' * 100000 + 'T' * 100)"
    result = anyio.run(
        lambda: run_command([sys.executable, "-c", script], timeout_s=10, output_limit=1000)
    )
    text = result.output.text()
    assert text.startswith("H" * 100)
    assert text.endswith("T" * 100)
    assert result.output.dropped == 100200 - 1000


def test_timeout_kills_a_tree_that_ignores_sigterm() -> None:
    script = "trap '' TERM; (trap '' TERM; sleep 60) & sleep 60"
    pids: list[int] = []
    result = anyio.run(
        lambda: run_command(["sh", "-c", script], timeout_s=0.3, grace_s=0.2, on_start=pids.append)
    )
    assert result.timed_out
    assert not procutil.group_alive(pids[0])


def test_leftover_background_job_does_not_outlive_the_command() -> None:
    pids: list[int] = []
    result = anyio.run(
        lambda: run_command(
            ["sh", "-c", "sleep 60 & echo started"],
            timeout_s=10,
            grace_s=0.2,
            on_start=pids.append,
        )
    )
    assert result.returncode == 0
    assert not procutil.group_alive(pids[0])


def test_missing_program_is_a_clear_error() -> None:
    with pytest.raises(CommandNotFound, match="no-such-program-xum"):
        anyio.run(lambda: run_command(["no-such-program-xum"], timeout_s=5))


@pytest.mark.skipif(procutil._SETPRIV is None, reason="needs util-linux setpriv (Linux)")
def test_a_command_does_not_outlive_a_killed_daemon() -> None:
    # A stand-in for the daemon: runs a long command through run_command, prints its pid.
    parent = textwrap.dedent(
        """
        import anyio, sys
        from xumd.procutil import run_command

        def started(pid):
            print(pid, flush=True)

        anyio.run(lambda: run_command(["sleep", "60"], timeout_s=60, on_start=started))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child = identify(int(proc.stdout.readline()))
        assert alive(child)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        until(lambda: not alive(child), timeout=10, message=f"{child} to die with its parent")
    finally:
        if proc.poll() is None:
            proc.kill()
