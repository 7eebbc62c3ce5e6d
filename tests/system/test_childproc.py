"""xumd.system.childproc: children started from the loop's thread, awaited through a pidfd; and the
git runner's choice of a process group (no terminal) or a session (a terminal) per call."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from xumd.system import childproc
from xumd.system.git import Git
from xumd.system.procutil import run_command

from tests.support.daemon import short_tmpdir
from tests.support.procs import ProcId, alive, identify

WHO = "import os; print(os.getpid() == os.getpgid(0), os.getpid() == os.getsid(0))"


def test_own_session_false_is_a_group_of_its_own_in_our_session() -> None:
    """The tree kill signals the child's group: it must be the child's alone (pgid = pid),
    while the session stays ours (no setsid: the cost this avoids)."""
    result = anyio.run(
        lambda: run_command([sys.executable, "-c", WHO], timeout_s=30, own_session=False)
    )
    assert result.output.text() == "True False\n"
    session = anyio.run(lambda: run_command([sys.executable, "-c", WHO], timeout_s=30))
    assert session.output.text() == "True True\n"


def test_a_timed_out_group_child_is_killed_with_its_tree() -> None:
    """Deadline and tree kill hold in a process group as in a session."""
    seen: list[ProcId] = []

    def record(chunk: bytes) -> None:
        seen.append(identify(int(chunk.split()[0])))  # identified while it surely runs

    result = anyio.run(
        lambda: run_command(
            ["sh", "-c", "sleep 60 & echo $!; wait"],
            timeout_s=2,
            grace_s=0.5,
            on_output=record,
            own_session=False,
        )
    )
    assert result.timed_out
    assert seen
    assert not alive(seen[0])


def test_exit_is_polled_where_there_is_no_pidfd(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel without pidfd_open (a fault this one cannot show: patched) still gets the exit
    status, by polling."""

    def no_pidfd(_pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    result = anyio.run(
        lambda: run_command(["sh", "-c", "sleep 0.05; echo done; exit 7"], timeout_s=30)
    )
    assert result.returncode == 7
    assert result.output.text() == "done\n"


def test_stdin_larger_than_a_pipe_is_written_whole() -> None:
    """A write that fills the pipe waits for the child to read (wait_writable), then goes on."""
    data = os.urandom(1 << 20).hex().encode()  # 2 MiB, far over a pipe's 64 KiB
    result = anyio.run(
        lambda: run_command(
            [sys.executable, "-c", "import sys; print(len(sys.stdin.buffer.read()))"],
            timeout_s=60,
            stdin=data,
        )
    )
    assert result.output.text() == f"{len(data)}\n"


def test_no_descriptor_is_left_open_after_runs() -> None:
    """Pipes and the pidfd are closed at the end of each run, not at garbage collection."""

    async def runs() -> tuple[int, int]:
        await run_command(["true"], timeout_s=30)
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(20):
            await run_command(["sh", "-c", "echo x"], timeout_s=30, stdin=b"y")
        return before, len(os.listdir("/proc/self/fd"))

    before, after = anyio.run(runs)
    assert after <= before


def test_has_controlling_tty_is_false_without_a_terminal() -> None:
    code = "from xumd.system.childproc import has_controlling_tty as h; print(h())"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        start_new_session=True,  # a new session has no controlling terminal
        check=True,
    )
    assert done.stdout == "False\n"


def _fake_git(where: Path) -> Path:
    """A `git` that reports whether it leads its group and its session."""
    fake = where / "fakegit"
    fake.write_text(f"#!{sys.executable}\n{WHO}\n")
    fake.chmod(0o755)
    return fake


def test_git_runs_in_a_process_group_when_the_daemon_has_no_terminal() -> None:
    tmp = short_tmpdir()
    code = textwrap.dedent(f"""
        import anyio
        from pathlib import Path
        from xumd.system.git import Git
        r = anyio.run(lambda: Git(binary={str(_fake_git(tmp))!r}).run(Path("/"), "x"))
        print(r.output.text().strip())
    """)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        start_new_session=True,
        check=True,
    )
    assert done.stdout == "True False\n", done.stderr


def test_git_runs_in_its_own_session_when_the_daemon_has_a_terminal() -> None:
    """With a controlling terminal, a hook git runs could open /dev/tty and stop (a background
    group reading its terminal): git then gets a session of its own, as before."""
    tmp = short_tmpdir()
    fake = _fake_git(tmp)
    out = tmp / "out"
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session leader with the pty as its controlling terminal
        try:
            result = anyio.run(lambda: Git(binary=str(fake)).run(Path("/"), "x"))
            out.write_text(f"{childproc.has_controlling_tty()} {result.output.text().strip()}")
        finally:
            os._exit(0)
    try:
        while True:  # drain the terminal until the child closes it
            try:
                if not os.read(fd, 1024):
                    break
            except OSError:
                break
    finally:
        os.close(fd)
        os.waitpid(pid, 0)
    assert out.read_text() == "True True True"


def test_on_start_comes_after_setpriv_set_the_parent_death_signal() -> None:
    """The start returns at setpriv's exec, before its prctl: a caller told the pid (a lease)
    must not meet a window where the daemon's death would not take the command along."""
    from xumd.system import procutil

    if procutil._SETPRIV is None:
        pytest.skip("no setpriv: commands run without a parent-death signal")
    images: list[str] = []

    def on_start(pid: int) -> None:
        images.append(os.path.realpath(f"/proc/{pid}/exe"))

    for _ in range(5):
        anyio.run(lambda: run_command(["sleep", "0.2"], timeout_s=30, on_start=on_start))
    setpriv = os.path.realpath(procutil._SETPRIV)
    assert images
    assert setpriv not in images


# Child and start() themselves (what run_command's tests do not reach on their own).


def _output(child: childproc.Child) -> str:
    async def read() -> str:
        assert child.stdout is not None
        chunks = [chunk async for chunk in child.stdout]
        await child.wait()
        return b"".join(chunks).decode()

    try:
        return anyio.run(read)
    finally:
        child.close()


def test_start_gives_a_session_of_its_own_unless_told_otherwise() -> None:
    """The default is the safe one (a session: no terminal can be acquired by the child)."""
    argv = [sys.executable, "-c", WHO]
    own = childproc.start(argv, cwd=None, env=None, stdin_pipe=False)
    assert _output(own) == "True True\n"
    group = childproc.start(argv, cwd=None, env=None, stdin_pipe=False, own_session=False)
    assert _output(group) == "True False\n"


def test_wait_without_a_pidfd_returns_the_exit_status_once_the_child_exits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Polled (no pidfd: patched), `wait` returns only after the exit, with its status: never
    the `None` of a child still running."""

    def no_pidfd(_pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    marker = short_tmpdir() / "exited"
    child = childproc.start(
        ["sh", "-c", f"sleep 0.3; touch {marker}; exit 7"], cwd=None, env=None, stdin_pipe=False
    )
    try:
        assert anyio.run(child.wait) == 7
        assert marker.exists()  # the child ran to its end before wait returned
        assert child.returncode == 7
    finally:
        child.close()


def test_close_closes_the_pipes_and_the_pidfd_at_once() -> None:
    """`close` frees every descriptor of the child while the object is still referenced (not
    at garbage collection): a daemon running thousands of git calls must not pile them up."""
    before = set(os.listdir("/proc/self/fd"))
    child = childproc.start(["cat"], cwd=None, env=None, stdin_pipe=True)
    opened = set(os.listdir("/proc/self/fd")) - before
    # stdin, stdout (stderr is merged into it), and the pidfd where the kernel has them
    assert len(opened) >= 2
    child.close()
    assert set(os.listdir("/proc/self/fd")) - before == set()
    assert anyio.run(child.wait) == 0  # cat saw its stdin closed and ended
    assert child.stdin is not None  # still referenced: nothing was collected
