"""The CLI as a new user finds it, against a real daemon, real git and real
processes: errors as JSON, busy messages, `run --detach`, an attached run stopped by the daemon,
`ws setup` after trust, `ws show` of an interrupted workspace, the archive summary's dropped and
preserved files, the README's Python snippet, the shipped systemd unit, shell completion."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xum_client import units
from xum_client.errors import ConnectionLost

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import commit_config, git, make_repo
from tests.support.holds import hold_env, release, wait_held
from tests.support.procs import alive, identify
from tests.support.wait import until

REPO = Path(__file__).resolve().parents[2]
XUM = str(Path(sys.executable).parent / "xum")


def xum(
    daemon: DaemonProcess | Path, *args: str, ok: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    root = daemon.root if isinstance(daemon, DaemonProcess) else daemon
    done = subprocess.run(
        [XUM, "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if ok:
        assert done.returncode == 0, (done.stdout, done.stderr)
    return done


def json_error(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The one JSON object a failed `--json` run prints on stdout (nothing on stderr)."""
    assert done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    error: dict[str, Any] = json.loads(lines[0])["error"]
    assert error["exit"] == done.returncode
    return error


@pytest.fixture
def repo(tmp_short: Path) -> Path:
    return make_repo(tmp_short / "repo")


@pytest.fixture
def sleeper(repo: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts outside the daemon; killed at the end whatever happened."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def new_ws(daemon: DaemonProcess, repo: Path, name: str) -> dict[str, Any]:
    if not daemon.call("project.list")["projects"]:
        xum(daemon, "project", "add", str(repo))
    made: dict[str, Any] = json.loads(xum(daemon, "--json", "ws", "new", "repo", name).stdout)
    return made["workspace"]


# -- --json errors ----------------------------------------------------------------------------


def test_json_errors_are_one_object_on_stdout_with_unchanged_exit_codes(
    daemon: DaemonProcess, repo: Path, tmp_short: Path
) -> None:
    xum(daemon, "project", "add", str(repo))

    # not found: exit 3, the daemon's code and kind (--json before or after the command)
    for args in (("--json", "ws", "show", "repo/nope"), ("ws", "show", "repo/nope", "--json")):
        done = xum(daemon, *args, ok=False)
        assert done.returncode == 3
        error = json_error(done)
        assert error["kind"] == "not_found" and error["code"] == -32001
        assert "nope" in error["message"]

    # a daemon error with data: invalid_state carries the state
    ws = new_ws(daemon, repo, "kept")
    done = xum(daemon, "--json", "ws", "keep", ws["id"], ok=False)
    assert done.returncode == 1
    error = json_error(done)
    assert error["kind"] == "invalid_state" and error["code"] == -32012
    assert error["data"] == {"state": "active"}

    # the CLI's own errors: no daemon (exit 4), usage (exit 2)
    empty = tmp_short / "empty"
    empty.mkdir()
    done = xum(empty, "--json", "status", ok=False)
    assert done.returncode == 4
    error = json_error(done)
    assert error["kind"] == "no_daemon" and error["code"] is None
    assert error["data"]["root"] == str(empty)
    for args in (("--json", "ws", "no-such-command"), ("ws", "no-such-command", "--json")):
        done = xum(daemon, *args, ok=False)
        assert done.returncode == 2
        assert json_error(done)["kind"] == "usage"

    # without --json: text on stderr, nothing on stdout, the same exit codes
    done = xum(daemon, "ws", "show", "repo/nope", ok=False)
    assert done.returncode == 3 and done.stdout == ""
    assert done.stderr.startswith("xum: not_found: ")
    assert xum(empty, "status", ok=False).returncode == 4
    # `--json` after `--` belongs to the command run, not to the CLI
    done = xum(daemon, "run", "repo/none", "--", "echo", "--json", ok=False)
    assert done.returncode == 1 and done.stdout == "" and "no workspace" in done.stderr


# -- busy: said once, each holder named with how to free it -----------------------------------


def test_busy_names_each_holder_once_with_how_to_free_it(
    daemon: DaemonProcess, repo: Path, sleeper: list[subprocess.Popen[bytes]]
) -> None:
    ws = new_ws(daemon, repo, "agent-b")
    # A detached agent of the daemon's, and a process of the user's with its cwd inside.
    detached = xum(
        daemon, "run", "--detach", "--kind", "agent", "repo/agent-b", "--", "sleep", "300"
    )
    proc_id = detached.stdout.strip()
    assert re.fullmatch(r"proc_[0-9a-f]{16}", proc_id), detached.stdout
    agent = daemon.call("process.get", {"process_id": proc_id})["process"]
    assert agent["state"] == "running" and agent["pid"]
    outside = subprocess.Popen(["sleep", "301"], cwd=ws["path"])
    sleeper.append(outside)

    done = xum(daemon, "ws", "archive", "repo/agent-b", ok=False)
    assert done.returncode == 1
    text = done.stderr
    assert text.count("busy") == 1, text  # the kind once, not again in the message
    assert text.startswith("xum: busy: cannot archive 'agent-b': in use by ")
    # each holder: kind, pid, process id, command line, how to free it
    assert (
        f"agent in pid {agent['pid']} ({proc_id}, `sleep 300`; free it: `xum kill {proc_id}`)"
        in text
    )
    assert (
        f"process sleep in pid {outside.pid} (`sleep 301`; free it: end pid {outside.pid})" in text
    )
    assert "`xum ws archive --stop`" in text

    error = json_error(xum(daemon, "--json", "ws", "archive", "repo/agent-b", ok=False))
    assert error["kind"] == "busy" and error["code"] == -32002
    holders = {h["pid"]: h for h in error["data"]["holders"]}
    assert holders[agent["pid"]]["process_id"] == proc_id
    assert holders[agent["pid"]]["command"] == "sleep 300"
    assert holders[agent["pid"]]["kind"] == "agent"
    assert "process_id" not in holders[outside.pid]  # not the daemon's
    assert holders[outside.pid]["command"] == "sleep 301"

    # Following the advice frees it.
    xum(daemon, "kill", proc_id)
    outside.kill()
    outside.wait(10)
    assert "archived agent-b" in xum(daemon, "ws", "archive", "repo/agent-b").stdout


# -- run --detach, and an attached run stopped by archive --stop -------------------------------


def test_detached_run_returns_and_an_attached_run_says_why_it_was_stopped(
    daemon: DaemonProcess, repo: Path
) -> None:
    new_ws(daemon, repo, "runs")
    detached = xum(
        daemon, "--json", "run", "-d", "--kind", "agent", "repo/runs", "--", "sleep", "300"
    )
    process = json.loads(detached.stdout)["process"]
    assert process["kind"] == "agent" and process["state"] == "running"
    ident = identify(process["pid"])
    assert alive(ident)  # still running after the CLI returned: it was not tied to it

    attached = subprocess.Popen(
        [
            XUM,
            "--root",
            str(daemon.root),
            "run",
            "--kind",
            "agent",
            "repo/runs",
            "--",
            "sleep",
            "302",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def attached_running() -> str | None:
            for p in daemon.call("process.list")["processes"]:
                if p["argv"] == ["sleep", "302"] and p["state"] == "running":
                    return str(p["id"])
            return None

        attached_id = until(attached_running, message="the attached agent to run")
        archived = xum(daemon, "ws", "archive", "repo/runs", "--stop").stdout
        assert "archived runs" in archived
        assert process["id"] in archived and attached_id in archived
        _out, err = attached.communicate(timeout=60)
    finally:
        if attached.poll() is None:
            attached.kill()
            attached.wait(10)
    assert attached.returncode == 128 + signal.SIGTERM
    assert (
        f"[xum: {attached_id} stopped by the daemon: its workspace was archived with --stop" in err
    ), err
    assert not alive(ident)


# -- workspace.setup / xum ws setup -----------------------------------------------------------


def commit_setup(repo: Path, command: str = "touch ran") -> None:
    commit_config(repo, f'[scripts]\nsetup = ["{command}"]\n', "setup")


def test_ws_setup_after_trust_runs_the_skipped_setup(daemon: DaemonProcess, repo: Path) -> None:
    commit_setup(repo)
    xum(daemon, "project", "add", str(repo))
    created = xum(daemon, "ws", "new", "repo", "a").stdout
    assert "setup: untrusted" in created and "then run its setup: xum ws setup repo/a" in created
    ws = json.loads(xum(daemon, "--json", "ws", "show", "repo/a").stdout)["workspace"]
    assert ws["setup"]["status"] == "untrusted"
    shown = xum(daemon, "ws", "show", "repo/a").stdout
    assert "setup: untrusted" in shown and "then run its setup: xum ws setup repo/a" in shown

    # Still untrusted: nothing runs, and the command says so (exit 1).
    done = xum(daemon, "ws", "setup", "repo/a", ok=False)
    assert done.returncode == 1 and "setup: untrusted" in done.stdout
    assert not (Path(ws["path"]) / "ran").exists()

    xum(daemon, "project", "trust", "repo")
    ran = xum(daemon, "ws", "setup", "repo/a").stdout
    assert "setup: ok" in ran
    assert (Path(ws["path"]) / "ran").exists()
    shown = xum(daemon, "ws", "show", "repo/a").stdout
    assert "setup: ok" in shown
    assert "untrusted" not in shown and "xum project trust" not in shown  # the stale hint is gone
    setup = json.loads(xum(daemon, "--json", "ws", "setup", ws["id"]).stdout)["setup"]
    assert setup["status"] == "ok" and setup["commands"] == 1

    # The Python client reaches it too, typed.
    import anyio
    from xum_client import AsyncClient
    from xum_protocol.models.workspace import WorkspaceSetupResult

    async def rerun() -> WorkspaceSetupResult:
        async with AsyncClient(daemon.root) as client:
            params = {"workspace_id": ws["id"]}
            return await client.call_model("workspace.setup", params, WorkspaceSetupResult)

    typed = anyio.run(rerun)
    assert typed.setup.status == "ok" and typed.workspace.id == ws["id"]


def test_ws_setup_refuses_archived_removed_and_busy_workspaces(
    root: Path, repo: Path, tmp_short: Path
) -> None:
    holds = tmp_short / "holds"
    daemon = DaemonProcess(root, env=hold_env("workspace.archive.hold", holds)).start()
    try:
        commit_setup(repo)
        a = new_ws(daemon, repo, "a")
        xum(daemon, "project", "trust", "repo")

        # mid-way through an archive (held): refused, naming what is in progress
        answer: dict[str, Any] = {}

        def archive() -> None:
            answer.update(daemon.call("workspace.archive", {"workspace_id": a["id"]}))

        worker = threading.Thread(target=archive)
        worker.start()
        try:
            wait_held("workspace.archive.hold", holds)
            error = json_error(xum(daemon, "--json", "ws", "setup", a["id"], ok=False))
            assert error["kind"] == "busy" and "archive in progress" in error["message"]
        finally:
            release("workspace.archive.hold", holds)
            worker.join(60)
        assert answer["workspace"]["state"] == "archived"

        # archived: invalid_state, saying to unarchive it
        done = xum(daemon, "ws", "setup", "repo/a", ok=False)
        assert done.returncode == 1
        assert "invalid_state" in done.stderr and "unarchive it" in done.stderr
        assert not (Path(a["path"]) / "ran").exists()

        # removed: not_found (exit 3)
        xum(daemon, "ws", "rm", "repo/a")
        error = json_error(xum(daemon, "--json", "ws", "setup", a["id"], ok=False))
        assert error["kind"] == "not_found" and error["exit"] == 3

        # active but its checkout gone: invalid_state, nothing run where it was
        b = new_ws(daemon, repo, "b")
        shutil.rmtree(b["path"])
        error = json_error(xum(daemon, "--json", "ws", "setup", "repo/b", ok=False))
        assert error["kind"] == "invalid_state" and "missing" in error["message"]
        assert not Path(b["path"]).exists()
    finally:
        daemon.close()


def test_interrupted_workspace_shows_its_reason_and_setup_refuses_it(
    root: Path, repo: Path
) -> None:
    daemon = DaemonProcess(root, env={"XUM_FAULT": "workspace.create.after_checkout"}).start()
    try:
        xum(daemon, "project", "add", str(repo))
        assert xum(daemon, "ws", "new", "repo", "cut", ok=False).returncode != 0
        assert daemon.wait() == -9
        daemon.env = {}
        daemon.start()
        reason = daemon.call("workspace.list")["workspaces"][0]["interrupted_reason"]
        assert reason

        shown = xum(daemon, "ws", "show", "repo/cut").stdout
        assert f"interrupted: {reason}" in shown  # in text mode, not only in --json
        assert "xum ws keep repo/cut" in shown

        error = json_error(xum(daemon, "--json", "ws", "setup", "repo/cut", ok=False))
        assert error["kind"] == "invalid_state" and "interrupted" in error["message"]
        assert error["data"]["interrupted"] is True
    finally:
        daemon.close()


def test_setup_rerun_cut_by_a_crash_is_settled_as_failed(root: Path, repo: Path) -> None:
    commit_setup(repo)
    daemon = DaemonProcess(root).start()
    try:
        ws = new_ws(daemon, repo, "a")
        xum(daemon, "project", "trust", "repo")
        daemon.terminate()
        daemon.env = {"XUM_FAULT": "workspace.setup.after_intent"}
        daemon.start()
        with pytest.raises(ConnectionLost):  # the daemon dies at the fault point
            daemon.call("workspace.setup", {"workspace_id": ws["id"]})
        assert daemon.wait() == -9
        daemon.env = {}
        daemon.start()
        setup = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]["setup"]
        assert setup["status"] == "failed"  # never left `running`
        assert "interrupted by a crash" in (setup["error"] or "")
        assert "setup: ok" in xum(daemon, "ws", "setup", "repo/a").stdout
    finally:
        daemon.close()


def test_setup_rerun_cut_by_a_shutdown_answers_its_failed_setup(
    root: Path, repo: Path, tmp_short: Path
) -> None:
    # A shutdown past its grace cuts the rerun's script: the row is never left `running`, and
    # the request answers what it committed (a failed setup saying why), not `shutting_down`.
    block, started = tmp_short / "block", tmp_short / "started"
    commit_setup(repo, f"touch {started}; while [ -e {block} ]; do sleep 0.05; done")
    write_config(root, "shutdown_grace_s = 0.5\nstop_grace_s = 1.0\n")
    daemon = DaemonProcess(root).start()
    try:
        ws = new_ws(daemon, repo, "a")
        xum(daemon, "project", "trust", "repo")
        block.touch()
        answer: dict[str, Any] = {}

        def run_setup() -> None:
            answer.update(daemon.call("workspace.setup", {"workspace_id": ws["id"]}))

        worker = threading.Thread(target=run_setup, daemon=True)
        worker.start()
        until(started.exists, message="the rerun setup to start")
        assert daemon.call("daemon.shutdown") == {"stopping": True}
        worker.join(30)
        assert not worker.is_alive() and daemon.wait(30) == 0
        setup = answer["setup"]  # a result, not an error
        assert setup["status"] == "failed" and "cut short" in setup["error"], setup
        assert "shutting down" in setup["error"]
        block.unlink()
        daemon.start()
        got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
        assert got["state"] == "active" and got["setup"]["status"] == "failed", got
        assert "setup: ok" in xum(daemon, "ws", "setup", "repo/a").stdout
    finally:
        daemon.close()


def test_project_rm_cut_part_way_exits_non_zero(root: Path, repo: Path, tmp_short: Path) -> None:
    # A shutdown cuts `xum project rm` in a teardown: the project stays, and the command must
    # not exit 0 (a script would take it as removed).
    block, started = tmp_short / "block", tmp_short / "started"
    teardown = f"touch {started}; while [ -e {block} ]; do sleep 0.05; done"
    commit_config(repo, f'[scripts]\nteardown = ["{teardown}"]\n')
    write_config(root, "shutdown_grace_s = 0.5\nstop_grace_s = 1.0\n")
    daemon = DaemonProcess(root).start()
    try:
        new_ws(daemon, repo, "a")
        new_ws(daemon, repo, "b")
        xum(daemon, "project", "trust", "repo")
        block.touch()
        removing = subprocess.Popen(
            [XUM, "--root", str(root), "project", "rm", "repo", "--force"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            until(started.exists, message="the first teardown to start")
            assert daemon.call("daemon.shutdown") == {"stopping": True}
            out, err = removing.communicate(timeout=60)
        finally:
            if removing.poll() is None:
                removing.kill()
                removing.wait(10)
        assert daemon.wait(30) == 0
        assert "was NOT removed" in out, (out, err)
        assert removing.returncode == 1, (out, err)
    finally:
        block.unlink(missing_ok=True)
        daemon.close()


# -- the archive summary's dropped / preserved line -------------------------------------------


def test_archive_summary_names_dropped_and_preserved_files(
    daemon: DaemonProcess, repo: Path
) -> None:
    (repo / ".gitignore").write_text(".env\nbuild/\n*.sock\n")
    (repo / ".xum").mkdir()
    (repo / ".xum" / "config.toml").write_text('preserve = [".env*"]\n')
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "ignore")
    ws = new_ws(daemon, repo, "a")
    path = Path(ws["path"])
    (path / ".env").write_text("SECRET=1\n")
    (path / "build").mkdir()
    (path / "build" / "out.o").write_bytes(b"x" * 100)
    os.mkfifo(path / "build" / "pipe")
    os.mkfifo(path / "top.sock")

    archived = json.loads(xum(daemon, "--json", "ws", "archive", "repo/a").stdout)
    dropped = archived["dropped"]
    assert dropped["preserved"] == [".env"]
    assert (dropped["count"], dropped["bytes"]) == (1, 100)  # out.o; FIFOs are not files
    assert dropped["paths"] == ["build/"]  # .env was preserved, not dropped
    assert sorted(s["path"] for s in dropped["special"]) == ["build/pipe", "top.sock"]

    xum(daemon, "ws", "unarchive", "repo/a")
    assert (path / ".env").read_text() == "SECRET=1\n"
    (path / "build").mkdir()
    (path / "build" / "out.o").write_bytes(b"x" * 100)
    os.mkfifo(path / "build" / "pipe")
    text = xum(daemon, "ws", "archive", "repo/a").stdout
    (line,) = [x for x in text.splitlines() if x.startswith("dropped:")]
    assert line == (
        "dropped: 1 ignored file(s), 100 bytes in build/; preserved 1: .env; "
        "1 special file(s) not saved: build/pipe (fifo)"
    )


# -- README, systemd unit, completion ---------------------------------------------------------


def readme_python() -> str:
    text = (REPO / "README.md").read_text()
    after = text[text.index("From Python") :]
    match = re.search(r"```python\n(.*?)```", after, re.S)
    assert match, "the README's Python snippet"
    return match.group(1)


def test_readme_python_snippet_runs_as_written(daemon: DaemonProcess, tmp_short: Path) -> None:
    snippet = tmp_short / "snippet.py"
    snippet.write_text(readme_python())
    env = {**os.environ, "XUM_ROOT": str(daemon.root)}
    env.pop("XUM_SOCKET", None)
    done = subprocess.run(
        [sys.executable, str(snippet)], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    sync_line, async_line = done.stdout.splitlines()
    assert sync_line == str(daemon.pid)
    assert async_line.split()[0] == str(daemon.pid)


def verify(unit_dir: Path, home: Path, runtime: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}
    for var in ("XDG_STATE_HOME", "XDG_CONFIG_HOME"):
        env.pop(var, None)
    names = (units.SERVICE_NAME, units.SOCKET_NAME)
    return subprocess.run(
        ["systemd-analyze", "--user", "verify", *(str(unit_dir / n) for n in names)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None or shutil.which("make") is None,
    reason="systemd-analyze (Debian: package systemd) or make is not installed",
)
def test_shipped_unit_verifies_once_make_install_user_ran(tmp_short: Path) -> None:
    home = tmp_short / "home"
    home.mkdir()
    runtime = tmp_short / "run"
    runtime.mkdir(mode=0o700)
    unit_dir = tmp_short / "units"
    unit_dir.mkdir()
    for name in (units.SERVICE_NAME, units.SOCKET_NAME):
        shutil.copy(REPO / "systemd" / name, unit_dir / name)
    # As shipped, on a home where no step put xumd: verify names the missing executable.
    before = verify(unit_dir, home, runtime)
    assert ".local/bin/xumd" in before.stderr, before.stderr

    # `-o install`: the venv is there (this test runs in it); never rebuilt from a test.
    made = subprocess.run(
        ["make", "-s", "-o", "install", "install-user", f"HOME={home}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    linked = home / ".local" / "bin" / "xumd"
    assert os.access(linked, os.X_OK) and linked.resolve() == (REPO / ".venv/bin/xumd").resolve()
    after = verify(unit_dir, home, runtime)
    assert after.returncode == 0 and after.stderr == "", after.stderr


def test_completion_scripts_and_the_complete_protocol(tmp_short: Path) -> None:
    bash_script = subprocess.run(
        [XUM, "completion", "bash"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    assert "_XUM_COMPLETE=bash_complete" in bash_script
    script = tmp_short / "xum.bash"
    script.write_text(bash_script)
    assert subprocess.run(["bash", "-n", str(script)], timeout=30).returncode == 0

    # click's env protocol: complete a subcommand of a lazily loaded group
    env = {**os.environ, "COMP_WORDS": "xum ws se", "COMP_CWORD": "2"}
    env["_XUM_COMPLETE"] = "bash_complete"
    done = subprocess.run([XUM], capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 0 and "plain,setup" in done.stdout.splitlines(), done.stdout

    # the whole loop in a real bash: the sourced function asks xum and fills COMPREPLY
    bin_dir = Path(XUM).parent
    loop = (
        f'export PATH={bin_dir}:"$PATH"; source {script}; '
        "COMP_WORDS=(xum comp); COMP_CWORD=1; _xum_completion xum; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(["bash", "-c", loop], capture_output=True, text=True, timeout=30)
    assert done.stdout.split() == ["completion"], (done.stdout, done.stderr)

    for shell, check in (("zsh", ["zsh", "-n"]), ("fish", ["fish", "--no-execute"])):
        text = subprocess.run(
            [XUM, "completion", shell], capture_output=True, text=True, timeout=30, check=True
        ).stdout
        assert f"_XUM_COMPLETE={shell}_complete" in text.replace('"', "")
        if shutil.which(shell):
            path = tmp_short / f"xum.{shell}"
            path.write_text(text)
            assert subprocess.run([*check, str(path)], timeout=30).returncode == 0
    done = subprocess.run([XUM, "completion", "tcsh"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "tcsh" in done.stderr


def test_a_hostile_command_line_is_named_escaped_and_bounded(
    daemon: DaemonProcess, repo: Path, sleeper: list[subprocess.Popen[bytes]]
) -> None:
    # A process of the user's whose argv carries an escape sequence, a newline and a long tail:
    # the busy message must neither pass them to the terminal nor grow without bound.
    ws = new_ws(daemon, repo, "hostile")
    evil = "\x1b[2J\nrm -rf ~" + "x" * 1000
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", evil], cwd=ws["path"]
    )
    sleeper.append(holder)
    until(
        lambda: daemon.call("process.holders", {"workspace_id": ws["id"]})["holders"],
        message="the holder to be seen",
    )
    error = json_error(xum(daemon, "--json", "ws", "rm", "repo/hostile", ok=False))
    assert error["kind"] == "busy"
    (found,) = [h for h in error["data"]["holders"] if h["pid"] == holder.pid]
    command = found["command"]
    assert "\x1b" not in command and "\n" not in command
    assert "\\x1b[2J\\nrm -rf ~xxx" in command
    assert len(command) <= 200 and command.endswith("…")
    text = xum(daemon, "ws", "rm", "repo/hostile", ok=False).stderr
    assert "\x1b" not in text and text.count("\n") == 1  # one line, its end


def test_ws_setup_is_fenced_while_it_runs(
    daemon: DaemonProcess, repo: Path, tmp_short: Path
) -> None:
    # The setup blocks reading a FIFO the test holds: while it runs, a second setup and an
    # archive of that workspace are refused `busy` (it holds the exclusive reservation).
    gate = tmp_short / "gate"
    os.mkfifo(gate)
    ws = new_ws(daemon, repo, "a")
    commit_setup(repo, f"cat {gate} > got")
    xum(daemon, "project", "trust", "repo")
    answer: dict[str, Any] = {}

    def run_setup() -> None:
        answer.update(daemon.call("workspace.setup", {"workspace_id": ws["id"]}))

    worker = threading.Thread(target=run_setup)
    worker.start()
    try:
        until(
            lambda: (
                daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]["setup"][
                    "status"
                ]
                == "running"
            ),
            message="the rerun setup to start",
        )
        for args in (("ws", "setup", "repo/a"), ("ws", "archive", "repo/a")):
            error = json_error(xum(daemon, "--json", *args, ok=False))
            assert error["kind"] == "busy" and "setup in progress" in error["message"], error
            assert not error["message"].startswith("busy"), error  # the kind says it
            text = xum(daemon, *args, ok=False).stderr
            assert text.startswith("xum: busy: workspace ") and text.count("busy") == 1, text
    finally:
        try:  # lets the script's `cat` finish; no reader (it never started): nothing to free
            fd = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            pass
        else:
            os.write(fd, b"opened\n")
            os.close(fd)
        worker.join(60)
    assert answer["setup"]["status"] == "ok"
    assert (Path(ws["path"]) / "got").read_text() == "opened\n"
    assert "archived a" in xum(daemon, "ws", "archive", "repo/a").stdout


def test_json_error_kinds_of_the_clis_own_failures() -> None:
    # The CLI's own exceptions, as `--json` reports them (no daemon needed to raise them).
    import click
    from xum_client.commands._errors import error_object
    from xum_client.commands.process import DaemonStopping, stop_note
    from xum_client.errors import ClientTimeout, ConnectionLost

    assert error_object(DaemonStopping("the daemon is stopping"), 75)["kind"] == "daemon_stopping"
    assert error_object(ConnectionLost("gone"), 1)["kind"] == "connection_lost"
    assert error_object(ClientTimeout("slow"), 1)["kind"] == "client_timeout"
    assert error_object(click.ClickException("no"), 1) == {
        "code": None,
        "kind": "error",
        "message": "no",
        "data": {},
        "exit": 1,
    }
    assert stop_note("proc_1", {"code": 0}) is None  # ended on its own: nothing to say
    assert stop_note("proc_1", {"signal": "SIGTERM", "stop_reason": "request"}) == (
        "proc_1 stopped by a request to stop it (`xum kill proc_1` or process.stop)"
    )


def test_socket_option_reaches_every_command_with_its_own_timeout(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    # `--socket` beats `--root`: the commands that open a client with a long timeout of their
    # own (du, gc, cleanup retry) must still go to the socket given, not to the root's.
    empty = tmp_short / "elsewhere"
    empty.mkdir()
    sock = str(daemon.socket_path)
    for args in (("du",), ("gc", "--dry-run"), ("cleanup", "retry"), ("ws", "ls")):
        done = xum(empty, "--socket", sock, "--json", *args, ok=False)
        assert done.returncode == 0, (args, done.stdout, done.stderr)


def test_a_bad_env_option_is_a_usage_error_before_any_daemon_is_asked(tmp_short: Path) -> None:
    nowhere = tmp_short / "no-daemon"
    nowhere.mkdir()
    for args in (
        ("ws", "new", "p", "n", "--env", "NOEQUALS"),
        ("ws", "new", "p", "n", "--env", "XUM_PORT=1"),
        ("run", "--env", "=1", "p/n", "--", "true"),
    ):
        done = xum(nowhere, *args, ok=False)
        assert done.returncode == 2 and "--env" in done.stderr, (args, done.stderr)
