"""xumd.system.procutil: the one way the daemon runs a command."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import anyio
import psutil
import pytest
from xumd.system import procstat, procutil
from xumd.system.platform import linux
from xumd.system.procutil import CommandNotFound, run_command

from tests.support.freezer import frozen
from tests.support.procs import ProcId, alive, identify
from tests.support.wait import until, wait_for


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
        from xumd.system.procutil import run_command

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


@pytest.mark.skipif(procutil._SETPRIV is None, reason="needs util-linux setpriv (Linux)")
def test_on_start_sees_the_command_itself_never_setpriv_before_its_exec() -> None:
    """Whoever `on_start` tells about the pid (a lease) relies on the parent-death signal:
    setpriv sets it and then execs the command, so `on_start` runs only once the pid runs the
    command's image, never setpriv's (the start returns while setpriv still runs)."""
    program = os.path.realpath(shutil.which("sleep") or "/bin/sleep")
    seen: list[str] = []

    def started(pid: int) -> None:
        seen.append(os.path.realpath(f"/proc/{pid}/exe"))
        os.kill(pid, signal.SIGKILL)

    for _ in range(5):
        anyio.run(lambda: run_command(["sleep", "60"], timeout_s=30, on_start=started))
    assert seen == [program] * 5


def test_stdin_is_fed_and_output_is_streamed() -> None:
    """Input larger than a pipe's buffer reaches the command whole (fed while its output is
    read), and every chunk of output reaches `on_output` in order, as it comes."""
    data = b"".join(b"line %d\n" % i for i in range(20_000))  # ~190 kB, beyond a 64 kB pipe
    chunks: list[bytes] = []
    result = anyio.run(
        lambda: run_command(
            ["cat"], stdin=data, timeout_s=10, output_limit=1 << 20, on_output=chunks.append
        )
    )
    assert result.ok and result.returncode == 0
    assert result.output.text().encode() == data
    assert b"".join(chunks) == data


def test_a_command_that_closes_stdin_early_still_answers() -> None:
    """A command that never reads its input (and exits) breaks the pipe under the feeder: the
    run still answers with the command's own exit status."""
    result = anyio.run(
        lambda: run_command(
            ["sh", "-c", "exec 0<&-; echo done"], stdin=b"x" * 300_000, timeout_s=30
        )
    )
    assert result.returncode == 0 and result.output.text() == "done\n"


def test_kill_tree_counts_a_zombie_as_gone() -> None:
    """A process that ended but was not reaped yet (a zombie) is not alive: kill_tree reports
    the tree gone instead of waiting for it and calling it a survivor of SIGKILL."""
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        gone = anyio.run(lambda: procutil.kill_tree(child.pid, child.pid, 0.2))
        assert gone is True
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE  # not reaped by it
    finally:
        child.kill()
        child.wait()


def test_kill_tree_reports_a_tree_that_survives_sigkill() -> None:
    """A frozen process (cgroup v1 freezer) outlives SIGKILL until thawed: kill_tree answers
    False after its bounded wait, never True for a tree that is still there."""
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        with frozen(child.pid):
            gone = anyio.run(lambda: procutil.kill_tree(child.pid, child.pid, 0.1))
            assert gone is False
        # Thawed: the signals it got take effect (the first one delivered ends it).
        assert child.wait(10) in (-signal.SIGTERM, -signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_kill_tree_without_a_group_reaches_the_tree() -> None:
    """Without a process group to signal (pgid None), the tree collected from the pid is still
    stopped: the command and its child."""
    parent = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert parent.stdout is not None
        sleeper = identify(int(parent.stdout.readline()))
        assert alive(sleeper)
        gone = anyio.run(lambda: procutil.kill_tree(parent.pid, None, 0.5))
        assert gone is True
        assert not alive(sleeper)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


def test_a_command_that_cannot_start_names_its_program(tmp_path: Path) -> None:
    """A start that fails (its working directory missing, or not a directory) is a
    CommandNotFound naming the program, never another argument or an IndexError."""
    with pytest.raises(CommandNotFound, match=r"^sh: "):
        anyio.run(lambda: run_command(["sh", "-c", "true"], cwd=tmp_path / "gone", timeout_s=5))
    (tmp_path / "file").write_text("")
    with pytest.raises(CommandNotFound, match=r"^sh: Not a directory"):
        anyio.run(lambda: run_command(["sh", "-c", "true"], cwd=tmp_path / "file", timeout_s=5))


def test_a_missing_working_directory_is_named_not_called_a_missing_command(
    tmp_path: Path,
) -> None:
    """A program that exists but whose working directory is gone (a checkout removed under a
    script) is not reported as `command not found`: the error names the directory."""
    gone = tmp_path / "gone"
    with pytest.raises(CommandNotFound) as failed:
        anyio.run(lambda: run_command(["sh", "-c", "true"], cwd=gone, timeout_s=5))
    assert "command not found" not in str(failed.value)
    assert str(failed.value) == f"sh: no working directory {gone}"
    with pytest.raises(CommandNotFound, match=r"^xum-no-such-program: command not found$"):
        anyio.run(lambda: run_command(["xum-no-such-program"], cwd=tmp_path, timeout_s=5))


def test_kill_tree_reports_a_tree_ended_by_sigkill_as_gone() -> None:
    """A group that ignores SIGTERM is ended by the SIGKILL after the grace: kill_tree answers
    True (gone), not False as if it had survived SIGKILL."""
    child = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; sleep 60 & wait"],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        until(lambda: len(procstat.tree_identities(child.pid)) >= 2, message="the tree to start")
        gone = anyio.run(lambda: procutil.kill_tree(child.pid, child.pid, 0.1))
        assert gone is True
        assert not procutil.group_alive(child.pid)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()


def _term_handled_by_kill_tree(handler: str) -> int:
    """Start `handler` (a Python script that handles SIGTERM and prints `ready`) in its own
    session, kill_tree it with a long grace, and answer its exit status (0: its handler ended
    it, not the SIGKILL)."""
    script = (
        "import signal, sys, time\n"
        + handler
        + "signal.signal(signal.SIGTERM, term)\nprint('ready', flush=True)\ntime.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        gone = anyio.run(lambda: procutil.kill_tree(child.pid, child.pid, 30.0))
        assert gone is True
        return child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_sigterm_gets_its_grace_before_sigkill(tmp_path: Path) -> None:
    """kill_tree lets a process that handles SIGTERM finish its handler within the grace (git
    removes its lock files that way) before any SIGKILL."""
    done = tmp_path / "cleaned-up"
    handler = (
        "def term(*_):\n"
        "    time.sleep(0.3)  # a clean-up that takes a moment\n"
        f"    open({str(done)!r}, 'w').close()\n"
        "    sys.exit(0)\n"
    )
    assert _term_handled_by_kill_tree(handler) == 0, "ended by SIGKILL, not its SIGTERM handler"
    assert done.exists()


def test_sigterm_is_sent_once_to_a_member_of_the_group() -> None:
    """A process of the signalled group gets one SIGTERM, not a second one as a member of the
    tree: many programs take a second SIGTERM as `quit now, skip the clean-up` (here: exit 3),
    which would cut the very grace the first one gives."""
    handler = (
        "seen = []\n"
        "def term(*_):\n"
        "    if seen:\n"
        "        sys.exit(3)  # asked twice: give up the clean-up\n"
        "    seen.append(1)\n"
        "    time.sleep(0.3)\n"
        "    sys.exit(0)\n"
    )
    assert _term_handled_by_kill_tree(handler) == 0, "a second SIGTERM cut its clean-up short"


def test_a_command_leads_its_own_session_and_is_not_ours_after_the_run() -> None:
    """The command runs in a new session and group of its own (so its whole group can be
    signalled without touching the daemon's), and once its exit status was read its pid no
    longer counts as the daemon's child (the orphan reaper may reap a process that reuses it)."""
    from xumd.system import containment

    result = anyio.run(
        lambda: run_command(
            [
                sys.executable,
                "-c",
                "import os; print(os.getpid() == os.getpgid(0) == os.getsid(0))",
            ],
            timeout_s=10,
        )
    )
    assert result.output.text() == "True\n"
    assert result.pid not in containment._own


def test_any_alive_looks_past_a_pid_that_is_gone() -> None:
    """A member of the tree that vanished (reaped by its parent) must not end the look before
    a live member is seen: the tree is not gone while one of it runs."""
    live = subprocess.Popen(["sleep", "60"])
    try:
        gone = next(p for p in range(4_000_000, 4_100_000) if not psutil.pid_exists(p))
        # The vanished pid first (a dict keeps its order), each with its start time.
        members = {gone: None, live.pid: procstat.start_time(live.pid)}
        assert procutil._any_alive(members) is True
    finally:
        live.kill()
        live.wait()


def test_a_cancelled_run_still_kills_a_tree_that_ignores_sigterm(tmp_path: Path) -> None:
    """A run cancelled mid-way (a shutdown) stops its tree to the end, shielded: the group that
    ignores SIGTERM gets the SIGKILL after the grace, and the escapee that left the group and
    the tree (setsid) is found by its marker and stopped too; only then is the cancellation
    taken."""
    from xumd.system.containment import Containment, root_tag, scan

    cont = Containment(tag=root_tag(tmp_path))
    marker = cont.marker("lease_cancel")
    script = "trap '' TERM; (setsid sleep 100 &); sleep 100"

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: run_command(
                    ["/bin/sh", "-c", script],
                    timeout_s=60,
                    grace_s=0.2,
                    containment=cont,
                    marker=marker,
                )
            )
            # the shell, its sleep, the escapee
            await wait_for(lambda: len(scan(cont.tag)) >= 3, timeout=20)
            tg.cancel_scope.cancel()

    try:
        anyio.run(main)
        assert [m.pid for m in scan(cont.tag)] == []
    finally:
        for m in scan(cont.tag):
            os.kill(m.pid, signal.SIGKILL)


def test_kill_tree_reaches_a_group_member_outside_the_tree() -> None:
    """A member of the group that is no longer a descendant (its parent exited: it was
    re-parented away) and ignores SIGTERM is reached by the group's SIGKILL after the grace."""
    leader = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; (sleep 100 & echo $!) ; exit 0"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    orphan: ProcId | None = None
    try:
        assert leader.stdout is not None
        orphan = identify(int(leader.stdout.readline()))
        leader.wait(10)
        assert alive(orphan) and os.getpgid(orphan.pid) == leader.pid
        assert orphan.pid not in procstat.tree_identities(leader.pid)
        gone = anyio.run(lambda: procutil.kill_tree(leader.pid, leader.pid, 0.2))
        assert gone is True
        assert not alive(orphan)
    finally:
        # Only that very orphan: once the group is empty its id may be another test's group.
        if orphan is not None and alive(orphan):
            os.kill(orphan.pid, signal.SIGKILL)
        if leader.poll() is None:
            leader.kill()
            leader.wait()


def test_without_setpriv_a_missing_program_is_named_not_its_argument(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Where util-linux's setpriv is missing, commands start directly: a program that is not
    found is the exec's own FileNotFoundError, still a CommandNotFound naming the program (not
    its argument), and not a missing working directory when that directory exists."""
    monkeypatch.setattr(procutil, "_SETPRIV", None)
    for cwd in (None, tmp_path):
        with pytest.raises(CommandNotFound, match=r"^xum-no-such-program: command not found$"):
            anyio.run(
                lambda where=cwd: run_command(
                    ["xum-no-such-program", "an-argument"], cwd=where, timeout_s=5
                )
            )
    with pytest.raises(CommandNotFound, match=r"^sh: no working directory "):
        anyio.run(lambda: run_command(["sh", "-c", "true"], cwd=tmp_path / "gone", timeout_s=5))


@pytest.mark.parametrize(
    "wrapper",
    [
        pytest.param(
            "setpriv",
            marks=pytest.mark.skipif(procutil._SETPRIV is None, reason="needs setpriv"),
        ),
        "none",
    ],
)
def test_a_program_named_by_a_path_that_cannot_run_is_a_clear_error_whatever_the_wrapper(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, wrapper: str
) -> None:
    """A program named by a path (absolute, or relative to the working directory) that is
    missing, not executable or a directory is a CommandNotFound, the same with or without the
    setpriv wrapper: never the wrapper's exit 127/126, which reads as the command's own failure."""
    if wrapper == "none":
        monkeypatch.setattr(procutil, "_SETPRIV", None)
    plain = tmp_path / "plain"
    plain.write_text("#!/bin/sh\n")  # not executable
    cases = {
        "/nonexistent/xum-prog": "command not found",
        "./xum-nope": "command not found",
        str(plain): "Permission denied",
        "./plain": "Permission denied",
        str(tmp_path): "Permission denied",
    }
    for program, error in cases.items():
        with pytest.raises(CommandNotFound, match=f"^{re.escape(program)}: {error}$"):
            anyio.run(lambda p=program: run_command([p, "arg"], cwd=tmp_path, timeout_s=5))
    plain.chmod(0o755)
    result = anyio.run(lambda: run_command(["./plain"], cwd=tmp_path, timeout_s=5))
    assert result.returncode == 0, result.output.text()
    # A relative PATH entry is searched in the command's working directory, as the exec does
    # (not in the daemon's).
    (tmp_path / "bin").mkdir()
    plain.rename(tmp_path / "bin" / "xum-tool")
    env = {**os.environ, "PATH": f"bin{os.pathsep}{os.environ.get('PATH', os.defpath)}"}
    result = anyio.run(lambda: run_command(["xum-tool"], cwd=tmp_path, env=env, timeout_s=5))
    assert result.returncode == 0, result.output.text()


def test_kill_tree_without_a_group_waits_for_a_tree_that_ignores_sigterm() -> None:
    """No group to signal and a tree that ignores SIGTERM: kill_tree does not answer "gone"
    while a member still runs; the SIGKILL after the grace ends it, then it answers True."""
    parent = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; sleep 60 & echo $!; wait"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert parent.stdout is not None
        sleeper = identify(int(parent.stdout.readline()))
        shell = identify(parent.pid)
        gone = anyio.run(lambda: procutil.kill_tree(parent.pid, None, 0.3))
        assert gone is True
        assert not alive(sleeper)
        assert parent.wait(10) == -signal.SIGKILL  # it outlived SIGTERM: ended by the SIGKILL
        assert not alive(shell)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


def test_a_descendant_outside_the_group_gets_its_own_sigterm(tmp_path: Path) -> None:
    """The group's SIGTERM does not reach a descendant that left the group (setsid): it gets
    its own SIGTERM, and so its chance to clean up, not only the SIGKILL after the grace."""
    cleaned = tmp_path / "cleaned"
    escapee = textwrap.dedent(
        f"""
        import os, signal
        def term(*_):
            with open({str(cleaned)!r}, "w") as handle:
                handle.write("term")
            os._exit(0)
        signal.signal(signal.SIGTERM, term)
        print(os.getpid(), flush=True)
        while True:
            signal.pause()
        """
    )
    leader_code = textwrap.dedent(
        f"""
        import signal, subprocess, sys
        subprocess.Popen([sys.executable, "-c", {escapee!r}], start_new_session=True)
        signal.pause()
        """
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", leader_code], stdout=subprocess.PIPE, start_new_session=True
    )
    escaped: ProcId | None = None
    try:
        assert leader.stdout is not None
        escaped = identify(int(leader.stdout.readline()))
        assert os.getpgid(escaped.pid) != leader.pid
        assert escaped.pid in procstat.tree_identities(leader.pid)
        gone = anyio.run(lambda: procutil.kill_tree(leader.pid, leader.pid, 5.0))
        assert gone is True
        assert cleaned.read_text() == "term"
        assert not alive(escaped)
    finally:
        if escaped is not None and alive(escaped):
            os.kill(escaped.pid, signal.SIGKILL)
        if leader.poll() is None:
            leader.kill()
        leader.wait()


@pytest.mark.skipif(procutil._SETPRIV is None, reason="needs util-linux setpriv (Linux)")
def test_a_cancellation_while_on_start_waits_for_setpriv_leaves_no_child() -> None:
    """`on_start` waits (awaits) until setpriv has exec'd the command: a cancellation landing
    in that wait (a shutdown) still stops the child and reaps it, as one at any later await
    does; the command never runs on unattended. Several runs: the wait is a few milliseconds,
    and a child that exec'd before the first look skips it."""
    token = f"{60 + os.getpid() % 1000 / 1000:.3f}"  # a `sleep` argument no other test uses
    started: list[int] = []

    async def cancelled_run() -> None:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await run_command(["sleep", token], timeout_s=30, on_start=started.append)

    for _ in range(5):
        anyio.run(cancelled_run)
    left = [
        p.pid
        for p in psutil.Process().children()
        if token in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE
    ]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    assert left == [], "a child outlived its cancelled run"


def test_a_daemon_whose_own_directory_was_deleted_still_runs_commands(tmp_path: Path) -> None:
    """The daemon's working directory (where it was started) deleted under it: a command, by
    PATH or with a working directory of its own, still runs; a relative program is still a
    clear CommandNotFound. Never an error from looking up the daemon's own directory."""
    gone = tmp_path / "started-here"
    gone.mkdir()
    probe = textwrap.dedent(
        f"""
        import os, anyio
        from xumd.system.procutil import CommandNotFound, run_command
        os.chdir({str(gone)!r})
        os.rmdir({str(gone)!r})
        by_path = anyio.run(lambda: run_command(["true"], timeout_s=10))
        with_cwd = anyio.run(lambda: run_command(["true"], cwd="/", timeout_s=10))
        try:
            anyio.run(lambda: run_command(["./xum-nope"], timeout_s=10))
        except CommandNotFound as exc:
            relative = str(exc)
        print(by_path.returncode, with_cwd.returncode, relative)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "0 0 ./xum-nope: command not found\n"


def _spawn_with_pid(target: int, tries: int = 50) -> subprocess.Popen[bytes] | None:
    """A process (not of any tree under test) given exactly `target` as its pid, through
    /proc/sys/kernel/ns_last_pid (root); None when other forks on the machine kept taking it."""
    for _ in range(tries):
        with open("/proc/sys/kernel/ns_last_pid", "w") as last:
            last.write(str(target - 1))
        stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
        if stranger.pid == target:
            return stranger
        stranger.kill()
        stranger.wait()
    return None


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/proc/sys/kernel/ns_last_pid"),
    reason="choosing a pid needs root and ns_last_pid (tests run as root in CI)",
)
def test_the_sigkill_after_the_grace_spares_a_process_that_took_a_members_pid() -> None:
    """A member of the tree ends during the grace and its pid is handed to another process
    (pids wrap: 32768 by default) before the grace is over: kill_tree's SIGKILL goes to the
    tree's processes, known by pid and start time, never to that stranger."""
    parent_code = (
        "import signal, subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '60'])\n"  # before the ignore: TERM ends it
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        # Older than the start-time tolerance when its pid is taken: a process started in
        # the same instant is indistinguishable by pid and start time, by design.
        "time.sleep(0.3)\n"
        "print(child.pid, flush=True)\n"
        "child.wait()\n"
        "print('reaped', flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], stdout=subprocess.PIPE, start_new_session=True
    )
    strangers: list[subprocess.Popen[bytes]] = []
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        until(
            lambda: child in procstat.tree_identities(parent.pid), message="the child in the tree"
        )

        def take_the_pid() -> None:
            assert parent.stdout is not None
            if parent.stdout.readline() == b"reaped\n":  # the child ended by the SIGTERM
                stranger = _spawn_with_pid(child)
                if stranger is not None:
                    strangers.append(stranger)

        taker = threading.Thread(target=take_the_pid)
        taker.start()
        gone = anyio.run(lambda: procutil.kill_tree(parent.pid, parent.pid, 5.0))
        taker.join(30)
        if not strangers:
            pytest.skip("the member's pid could not be handed to a stranger (a busy machine)")
        assert gone is True
        assert strangers[0].poll() is None, "the stranger that took a member's pid was killed"
        assert parent.wait(10) == -signal.SIGKILL  # the tree itself was ended
    finally:
        for proc in (*strangers, parent):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/proc/sys/kernel/ns_last_pid"),
    reason="choosing a pid needs root and ns_last_pid (tests run as root in CI)",
)
def test_a_member_whose_pid_is_reused_while_the_tree_is_read_is_not_a_member(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tree is listed, and a member ends and its pid goes to a stranger before that
    member is identified (a busy machine between two reads: this is what failed once on two
    workers). Parent and start time come from one read, so the stranger is no member: it
    gets neither kill_tree's SIGTERM nor its SIGKILL."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "child = subprocess.Popen(['sleep', '60'])\n"
            "print(child.pid, flush=True)\n"
            "child.wait()\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    strangers: list[subprocess.Popen[bytes]] = []
    real_stat_fields = linux.stat_fields
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        until(
            lambda: child in procstat.tree_identities(parent.pid), message="the child in the tree"
        )

        def reused_before_read(pid: int, *, strict: bool = False) -> list[str] | None:
            if pid == child and not strangers:
                os.kill(child, signal.SIGKILL)
                until(lambda: not os.path.exists(f"/proc/{child}"), message="the child reaped")
                stranger = _spawn_with_pid(child)
                if stranger is None:
                    pytest.skip("the member's pid could not be given to a stranger (busy machine)")
                strangers.append(stranger)
            return real_stat_fields(pid, strict=strict)

        monkeypatch.setattr(linux, "stat_fields", reused_before_read)
        gone = anyio.run(lambda: procutil.kill_tree(parent.pid, parent.pid, 5.0))
        assert strangers, "the member was never read"
        assert gone is True
        assert strangers[0].poll() is None, "the stranger that took a member's pid was signalled"
        assert parent.wait(10) == -signal.SIGTERM
    finally:
        for proc in (*strangers, parent):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.mark.parametrize("with_cwd", [True, False])
def test_a_program_gone_between_its_check_and_its_start_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_cwd: bool
) -> None:
    """The program is checked before the start; one removed in between (a fault: the start
    fails with ENOENT although the working directory is there) is still the CommandNotFound
    naming that program, never a missing working directory or another argument."""

    def gone(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(procutil.childproc, "start", gone)
    cwd = tmp_path if with_cwd else None
    with pytest.raises(CommandNotFound) as missing:
        anyio.run(lambda: run_command(["sh", "-c", "true"], cwd=cwd, timeout_s=5))
    assert str(missing.value) == "sh: command not found"
