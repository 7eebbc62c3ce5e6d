"""`xum`'s two ways in (the fast `xum status` of `xum_client.entry`, and the click command line)
answer alike, and neither leaves a traceback when the caller closed a standard stream or its
reader went away (`commands/_stdio.py`, README "Exit codes")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xum_client.commands import _stdio

from tests.support.daemon import DaemonProcess, short_tmpdir
from tests.support.gitrepo import make_repo
from tests.support.wait import until

XUM = str(Path(sys.executable).parent / "xum")
CLICK_CLI = [sys.executable, "-c", "from xum_client.cli import main; main()"]


def run(argv: list[str], env: dict[str, str] | None = None, **kwargs: Any) -> Any:
    base = {k: v for k, v in os.environ.items() if not k.startswith("XUM_")}
    if "stdout" not in kwargs:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return subprocess.run(argv, text=True, timeout=60, env={**base, **(env or {})}, **kwargs)


def run_closing(argv: list[str], streams: str, env: dict[str, str] | None = None) -> Any:
    """`argv` with the standard streams `streams` names closed by a real shell (`>&-`)."""
    closes = " ".join(f"{fd}>&-" for fd in streams)
    return run(["sh", "-c", f'exec "$@" {closes}', "sh", *argv], env)


def run_reader_gone(argv: list[str], env: dict[str, str] | None = None) -> Any:
    """`argv` writing into a pipe whose reader has already gone: every write fails (EPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return run(argv, env, stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)


def _masked(text: str) -> str:
    # What changes between two calls to one daemon: its uptime.
    if text.startswith("{"):
        data = json.loads(text)
        data.pop("uptime_s", None)
        return json.dumps(data, sort_keys=True)
    return "\n".join(line for line in text.splitlines() if not line.startswith("uptime:"))


# -- the fast entry and click agree ------------------------------------------------------------


@pytest.fixture(scope="module")
def shared() -> Iterator[DaemonProcess]:
    daemon = DaemonProcess(short_tmpdir() / "root").start()
    yield daemon
    daemon.close()
    shutil.rmtree(daemon.root.parent, ignore_errors=True)


def _forms(
    daemon: DaemonProcess | None, missing: Path
) -> Iterator[tuple[list[str], dict[str, str]]]:
    root = str(daemon.root) if daemon else str(missing)
    socket = str(daemon.socket_path) if daemon else str(missing / "xumd.sock")
    yield ["--root", root], {}
    yield [f"--root={root}"], {}
    yield ["--socket", socket], {}
    yield [], {"XUM_ROOT": root}
    yield [], {"XUM_SOCKET": socket}


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("up", [True, False], ids=["up", "down"])
def test_the_fast_status_says_what_click_says(
    shared: DaemonProcess, tmp_short: Path, as_json: bool, up: bool
) -> None:
    daemon = shared
    for options, env in _forms(daemon if up else None, tmp_short / "none"):
        args = [*options, "status", *(["--json"] if as_json else [])]
        fast = run([XUM, *args], env)
        slow = run([*CLICK_CLI, *args], env)
        seen = (fast.returncode, _masked(fast.stdout), fast.stderr)
        assert seen == (slow.returncode, _masked(slow.stdout), slow.stderr), (args, env)
        assert fast.returncode == (0 if up else 4), (args, env, fast.stderr)
        if up and as_json:
            assert json.loads(fast.stdout)["pid"] == daemon.pid
        elif up:
            assert f"pid:         {daemon.pid}\n" in fast.stdout
        elif as_json:
            assert json.loads(fast.stdout)["error"]["kind"] == "no_daemon"
        else:
            assert fast.stderr.startswith("xum: no_daemon: no daemon on "), fast.stderr


# -- closed streams and a reader gone ----------------------------------------------------------


# `xum` (what a user runs) for every command; the click command line's own `status` too, since
# `xum status` off a terminal never reaches it.
COMMANDS = [
    pytest.param([XUM, "status"], id="fast status"),
    pytest.param([XUM, "--json", "status"], id="fast json status"),
    pytest.param([*CLICK_CLI, "status"], id="click status"),
    pytest.param([*CLICK_CLI, "--json", "status"], id="click json status"),
    pytest.param([XUM, "ws", "ls"], id="ws ls"),
    pytest.param([XUM, "--json", "project", "ls"], id="json project ls"),
    pytest.param([XUM, "daemon", "status"], id="daemon status"),
]
ENTRIES = {"fast": [XUM], "click": CLICK_CLI}


def _with_root(command: list[str], root: Path) -> list[str]:
    at = 1 if command[0] == XUM else len(CLICK_CLI)
    return [*command[:at], "--root", str(root), *command[at:]]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_closed_stdout_is_the_null_device(shared: DaemonProcess, command: list[str]) -> None:
    # The caller asked for no output: the command's own exit code, no traceback.
    done = run_closing(_with_root(command, shared.root), "1")
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_closed_stdout_keeps_a_failures_code_and_message(entry: str, tmp_short: Path) -> None:
    done = run_closing([*ENTRIES[entry], "--root", str(tmp_short), "status"], "1")
    assert done.returncode == 4
    assert done.stderr.startswith("xum: no_daemon: no daemon on "), done.stderr


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_closed_stderr_keeps_a_failures_code(entry: str, tmp_short: Path, as_json: bool) -> None:
    args = ["--root", str(tmp_short), *(["--json"] if as_json else []), "status"]
    done = run_closing([*ENTRIES[entry], *args], "2")
    assert done.returncode == 4
    if as_json:
        assert json.loads(done.stdout)["error"]["kind"] == "no_daemon"
    else:
        assert done.stdout == ""


@pytest.mark.parametrize("entry", ENTRIES)
def test_all_three_streams_closed(shared: DaemonProcess, entry: str) -> None:
    done = run_closing([*ENTRIES[entry], "--root", str(shared.root), "status"], "012")
    assert done.returncode == 0


@pytest.mark.parametrize(
    "command",
    [
        *COMMANDS,
        pytest.param([XUM, "--help"], id="help"),
        pytest.param([XUM, "ws", "ls", "--help"], id="ws ls help"),
        pytest.param([XUM, "--version"], id="version"),
    ],
)
def test_a_reader_gone_is_exit_141_without_a_traceback(
    shared: DaemonProcess, command: list[str]
) -> None:
    done = run_reader_gone(_with_root(command, shared.root))
    assert (done.returncode, done.stderr) == (_stdio.EXIT_BROKEN_PIPE, "")


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_reader_gone_beats_a_failures_json(entry: str, tmp_short: Path) -> None:
    # The failure's JSON could not be written either: the reader's exit, still no traceback.
    done = run_reader_gone([*ENTRIES[entry], "--root", str(tmp_short), "--json", "status"])
    assert (done.returncode, done.stderr) == (_stdio.EXIT_BROKEN_PIPE, "")


def test_a_broken_pipe_that_is_not_the_outputs_is_raised() -> None:
    # A bug elsewhere (a pipe to a child, say) must not pass for a reader that went away.
    def command() -> None:
        raise BrokenPipeError(32, "not stdout")

    with pytest.raises(BrokenPipeError, match="not stdout"):
        _stdio.run_guarded(command)


def test_a_broken_pipe_carried_past_click_that_is_not_the_outputs_is_raised() -> None:
    def command() -> None:
        try:
            raise BrokenPipeError(32, "not stdout either")
        except BrokenPipeError as exc:
            raise _stdio.OutputGone() from exc

    with pytest.raises(BrokenPipeError, match="not stdout either"):
        _stdio.run_guarded(command)


@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["unbuffered", "buffered"])
@pytest.mark.parametrize(
    "command",
    [
        *COMMANDS,
        pytest.param([XUM, "--help"], id="help"),
    ],
)
def test_an_output_that_cannot_be_written_is_one_line_and_exit_1(
    shared: DaemonProcess, command: list[str], unbuffered: str
) -> None:
    # /dev/full: every write fails with ENOSPC, as on a full disk.
    with open("/dev/full", "w") as full:
        done = run(
            _with_root(command, shared.root),
            {"PYTHONUNBUFFERED": unbuffered},
            stdout=full,
            stderr=subprocess.PIPE,
        )
    assert done.returncode == 1
    assert done.stderr == "xum: cannot write the output: No space left on device\n"


def test_an_attached_run_whose_reader_went_away_ends_141_and_its_command_with_it(
    shared: DaemonProcess, tmp_short: Path
) -> None:
    # `xum run WS -- yes | head -1`: the endless command's output has nowhere to go; the run
    # ends like any writer there, and the daemon stops the command its connection carried.
    repo = make_repo(tmp_short / "repo")
    project = shared.call("project.add", {"path": str(repo), "name": "runs"})["project"]
    shared.call("workspace.create", {"project_id": project["id"], "name": "yes"})
    done = run_reader_gone([XUM, "--root", str(shared.root), "run", "runs/yes", "--", "yes"])
    assert (done.returncode, done.stderr) == (_stdio.EXIT_BROKEN_PIPE, "")

    def stopped() -> bool:
        listed = shared.call("process.list", {})["processes"]
        ours = [p for p in listed if p["argv"] == ["yes"]]
        return bool(ours) and all(p["state"] != "running" for p in ours)

    until(stopped, timeout=30, message="the daemon to stop the run's command")


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_failure_whose_message_cannot_be_written_keeps_its_code(
    entry: str, tmp_short: Path
) -> None:
    # stderr on a full disk: the message is lost, the exit code (4: no daemon) is not.
    with open("/dev/full", "w") as full:
        done = run(
            [*ENTRIES[entry], "--root", str(tmp_short), "status"],
            stdout=subprocess.PIPE,
            stderr=full,
        )
    assert (done.returncode, done.stdout) == (4, "")


def test_a_standard_descriptor_taken_by_a_file_is_never_written_as_the_stream(
    tmp_short: Path,
) -> None:
    # stdout gone (None) while descriptor 1 already belongs to a file the process opened: the
    # mended stream is /dev/null, never that file.
    taken = tmp_short / "taken"
    code = (
        "import os, sys\n"
        "from xum_client.commands import _stdio\n"
        "os.close(1)\n"
        f"assert os.open({str(taken)!r}, os.O_WRONLY | os.O_CREAT, 0o600) == 1\n"
        "sys.stdout = None\n"
        "_stdio.prepare()\n"
        "print('must not reach the file')\n"
        "sys.stdout.flush()\n"
    )
    done = run([sys.executable, "-c", code])
    assert done.returncode == 0, done.stderr
    assert taken.read_text() == ""
