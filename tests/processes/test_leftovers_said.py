"""A run does not outlive itself, and says so: when an exec, a setup or a teardown command ends,
containment stops what it left running (a background job in its group, a `setsid` double fork),
and the run's record names each one (pid, command, signal, how long it had run): the process's
exit and its `process.exited` event, `xum run` and `xum ps`, the setup's result, the teardown
step's record. Real daemon, real processes, real CLI (docs/PROCESSES.md, "Containment")."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xum_client.sync import Client

from tests.support.daemon import DaemonProcess, run_xum, short_tmpdir, write_config
from tests.support.gitrepo import commit_config, make_repo
from tests.support.wait import until

# Each leftover is started and has exec'd its program before the command ends (the loop waits,
# inside the command, until its /proc cmdline shows it), so what it was is known exactly.
SHOWN = "until grep -q {tag} /proc/{pid}/cmdline 2>/dev/null; do sleep 0.01; done"
GROUP_JOB = "sleep {n} & echo $! > {n}.pid; " + SHOWN.format(tag="{n}", pid="$!")
DOUBLE_FORK = "setsid sh -c 'exec sleep {n}' & echo $! > {n}.pid; " + SHOWN.format(
    tag="{n}", pid="$!"
)


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    base = short_tmpdir()
    # A short grace: a leftover that ignores SIGTERM is SIGKILLed half a second later.
    write_config(base / "root", "stop_grace_s = 0.5\n")
    running = DaemonProcess(base / "root").start()
    try:
        yield running
    finally:
        running.close()
        shutil.rmtree(base, ignore_errors=True)


def _workspace(daemon: DaemonProcess, name: str, config: str | None = None) -> dict[str, Any]:
    repo = make_repo(daemon.root.parent / f"repo-{name}")
    if config is not None:
        commit_config(repo, config)
    project = daemon.call("project.add", {"path": str(repo), "name": name})["project"]
    if config is not None:
        daemon.call("project.trust", {"project_id": project["id"]})
    made = daemon.call("workspace.create", {"project_id": project["id"], "name": "ws"})
    return made


def _pid(checkout: Path, n: int) -> int:
    return int((checkout / f"{n}.pid").read_text())


def _check(entry: dict[str, Any], pid: int, argv: list[str]) -> None:
    assert entry["pid"] == pid and entry["argv"] == argv, entry
    assert entry["signal"] == "SIGTERM", entry
    assert isinstance(entry["ran_s"], float) and 0 <= entry["ran_s"] < 60, entry
    assert not _runs(pid, argv), f"{argv} still runs"


def _runs(pid: int, argv: list[str]) -> bool:
    """That very command still runs at `pid` (a reused pid runs something else)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1] == [
            a.encode() for a in argv
        ]
    except OSError:
        return False


def test_an_exec_s_exit_names_what_it_left_running_and_stopped(daemon: DaemonProcess) -> None:
    ws = _workspace(daemon, "exec")["workspace"]
    checkout = Path(ws["path"])
    script = f"{GROUP_JOB.format(n=311)}; {DOUBLE_FORK.format(n=312)}; echo started"
    with Client(daemon.root) as watcher:
        watcher.call("events.subscribe", {})
        proc = daemon.call(
            "process.spawn",
            {"workspace_id": ws["id"], "kind": "exec", "argv": ["sh", "-c", script]},
        )["process"]
        done = daemon.call("process.wait", {"process_id": proc["id"], "timeout_s": 30})["process"]
        exited: list[dict[str, Any]] = []

        def exit_event() -> bool:
            event = watcher.next_notification()["params"]
            if event["type"] == "process.exited" and event["data"]["process"]["id"] == proc["id"]:
                exited.append(event["data"]["process"])
            return bool(exited)

        until(exit_event, message="process.exited")
    group_job, double_fork = _pid(checkout, 311), _pid(checkout, 312)
    # The command itself ended cleanly; what it left is named, each with how it was stopped.
    assert done["exit"]["code"] == 0 and done["exit"]["settled_by"] == "exit", done
    leftovers = {e["pid"]: e for e in done["exit"]["leftovers"]}
    assert set(leftovers) == {group_job, double_fork}, done["exit"]
    _check(leftovers[group_job], group_job, ["sleep", "311"])
    _check(leftovers[double_fork], double_fork, ["sleep", "312"])
    assert exited[0]["exit"]["leftovers"] == done["exit"]["leftovers"]
    # `xum ps --all` says it in one line under the table.
    listed = run_xum(daemon, "ps", "--all", ws["id"])
    assert listed.returncode == 0, listed
    (line,) = [x for x in listed.stdout.splitlines() if x.startswith(f"{proc['id']} left")]
    assert "left 2 processes running, stopped when it ended" in line, line
    assert f"pid {group_job} (sleep 311; SIGTERM, ran " in line, line
    assert "xum run --detach" in line, line


def test_a_leftover_that_ignores_sigterm_is_named_as_killed(daemon: DaemonProcess) -> None:
    """In the group and out of it (`setsid`), a leftover that ignores SIGTERM outlives the
    grace: its entry says SIGKILL, the signal that ended it."""
    ws = _workspace(daemon, "kill")["workspace"]
    checkout = Path(ws["path"])
    deaf = "trap '' TERM; "
    script = (
        f"{deaf}{GROUP_JOB.format(n=317)}; {DOUBLE_FORK.format(n=318)}; trap - TERM; echo started"
    )
    proc = daemon.call(
        "process.spawn",
        {"workspace_id": ws["id"], "kind": "exec", "argv": ["sh", "-c", script]},
    )["process"]
    done = daemon.call("process.wait", {"process_id": proc["id"], "timeout_s": 30})["process"]
    leftovers = {e["pid"]: e for e in done["exit"]["leftovers"]}
    for n in (317, 318):
        entry = leftovers[_pid(checkout, n)]
        assert entry["argv"] == ["sleep", str(n)] and entry["signal"] == "SIGKILL", entry
        assert not _runs(entry["pid"], entry["argv"])


def test_xum_run_says_what_its_command_left_running(daemon: DaemonProcess) -> None:
    ws = _workspace(daemon, "run")["workspace"]
    ran = run_xum(daemon, "run", ws["id"], "--", "sh", "-c", GROUP_JOB.format(n=313))
    assert ran.returncode == 0, ran
    pid = _pid(Path(ws["path"]), 313)
    assert (
        f"left 1 process running, stopped when it ended: pid {pid} (sleep 313; SIGTERM, ran"
        in ran.stderr
    ), ran.stderr
    assert not _runs(pid, ["sleep", "313"])
    # Nothing left behind: nothing said.
    clean = run_xum(daemon, "run", ws["id"], "--", "true")
    assert clean.returncode == 0 and "left" not in clean.stderr, clean


def test_a_setup_and_a_teardown_name_what_they_left_running(daemon: DaemonProcess) -> None:
    config = (
        "[scripts]\n"
        f"setup = [{json.dumps(GROUP_JOB.format(n=314))}]\n"
        f"teardown = [{json.dumps(DOUBLE_FORK.format(n=315))}]\n"
    )
    made = _workspace(daemon, "scripts", config)
    ws, setup = made["workspace"], made["setup"]
    checkout = Path(ws["path"])
    assert setup["status"] == "ok", setup
    pid = _pid(checkout, 314)
    (entry,) = setup["leftovers"]
    _check(entry, pid, ["sleep", "314"])
    # The workspace's own record keeps it, as the setup's outcome.
    got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert got["setup"]["leftovers"] == setup["leftovers"], got
    # The teardown runs at the removal; its step's record names what it left and was stopped.
    removed = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    assert removed["cleanup"]["status"] == "completed", removed
    listed = daemon.call("cleanup.list", {"workspace_id": ws["id"]})["obligations"]
    (teardown,) = [o for o in listed if o["kind"] == "teardown"]
    assert teardown["state"] == "completed", teardown
    (entry,) = teardown["detail"]["leftovers"]
    assert entry["argv"] == ["sleep", "315"] and entry["signal"] == "SIGTERM", teardown
    assert not _runs(entry["pid"], entry["argv"])


def test_a_stopped_process_s_tree_is_part_of_the_stop_not_leftovers(daemon: DaemonProcess) -> None:
    """`process.stop`: the whole tree goes with the stop, which `stop_reason` says; a child that
    outlives its leader's SIGTERM (it ignores it) is not reported as something it left."""
    ws = _workspace(daemon, "stop")["workspace"]
    script = "(trap '' TERM; exec sleep 316) & echo $! > 316.pid; " + SHOWN.format(
        tag="316", pid="$!"
    )
    proc = daemon.call(
        "process.spawn",
        {"workspace_id": ws["id"], "kind": "exec", "argv": ["sh", "-c", f"{script}; wait"]},
    )["process"]
    pid_file = Path(ws["path"]) / "316.pid"
    until(lambda: pid_file.exists() and _runs(int(pid_file.read_text()), ["sleep", "316"]))
    stopped = daemon.call("process.stop", {"process_id": proc["id"], "grace_s": 0.5})["process"]
    assert stopped["exit"]["stop_reason"] == "request", stopped
    assert stopped["exit"]["leftovers"] == [], stopped["exit"]
    assert not _runs(int(pid_file.read_text()), ["sleep", "316"])
