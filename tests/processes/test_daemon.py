"""Processes and leases through a real daemon: RPC, busy refusals, SIGKILL and restart,
shutdown of a stubborn tree, --keep-processes, and the spawn gate's crash window."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from xum_client.errors import XumRpcError

from tests.processes.test_support import (
    external_processes,
    insert_workspace,
    pids_in,
    stubborn_argv,
)
from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project, create
from tests.support.procs import ProcId, alive, identify, identify_all
from tests.support.wait import until

CONFIG = "stop_grace_s = 0.5\ndrain_deadline_s = 8\n[processes]\nprobe_interval_s = 0.1\n"

external = pytest.fixture(external_processes, name="external")


@pytest.fixture
def root(tmp_short: Path) -> Path:
    write_config(tmp_short / "root", CONFIG)
    return tmp_short / "root"


def err(daemon: DaemonProcess, method: str, params: dict[str, Any]) -> XumRpcError:
    with pytest.raises(XumRpcError) as info:
        daemon.call(method, params)
    return info.value


def spawn(daemon: DaemonProcess, ws: str, argv: list[str], **extra: Any) -> dict[str, Any]:
    params = {"workspace_id": ws, "kind": "exec", "argv": argv, **extra}
    process: dict[str, Any] = daemon.call("process.spawn", params)["process"]
    return process


def output_text(daemon: DaemonProcess, process_id: str) -> str:
    text: str = daemon.call("process.output", {"process_id": process_id})["data"]
    return text


def test_run_a_command_in_a_workspace_and_refuse_bad_input(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    repo = make_repo(tmp_short / "repo")
    project = add_project(daemon, repo)
    ws = create(daemon, project["id"], "w1")["workspace"]
    proc = spawn(daemon, ws["id"], ["sh", "-c", "pwd; echo $XUM_WORKSPACE_ID; exit 4"])
    done = daemon.call("process.wait", {"process_id": proc["id"], "timeout_s": 10})["process"]
    assert done["exit"]["code"] == 4 and done["exit"]["settled_by"] == "exit"
    out = daemon.call("process.output", {"process_id": proc["id"], "wait_s": 1})
    assert out["data"].split() == [os.path.realpath(ws["path"]), ws["id"]]
    assert out["exited"]

    assert (
        err(daemon, "process.spawn", {"workspace_id": ws["id"], "kind": "exec", "argv": []}).kind
        == "invalid_params"
    )
    missing = err(
        daemon, "process.spawn", {"workspace_id": ws["id"], "kind": "exec", "argv": ["nope-xum"]}
    )
    assert missing.kind == "invalid_params" and "nope-xum" in str(missing)
    bad_sig = err(daemon, "process.signal", {"process_id": proc["id"], "signal": "NOPE"})
    assert bad_sig.kind == "invalid_params"
    not_pid = err(
        daemon, "lease.acquire", {"workspace_id": ws["id"], "kind": "editor", "pid": 4_000_000}
    )
    assert not_pid.kind == "invalid_params" and "not a running process" in str(not_pid)
    assert err(daemon, "process.get", {"process_id": "proc_" + "0" * 16}).kind == "not_found"
    assert err(daemon, "process.get", {"process_id": ws["id"]}).kind == "invalid_scope"
    unknown_ws = "ws_" + "0" * 16
    assert err(daemon, "process.list", {"workspace_id": unknown_ws}).kind == "not_found"
    assert err(daemon, "lease.list", {"workspace_id": unknown_ws}).kind == "not_found"
    assert err(daemon, "process.holders", {"workspace_id": unknown_ws}).kind == "not_found"

    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    archived = err(
        daemon, "lease.acquire", {"workspace_id": ws["id"], "kind": "editor", "pid": os.getpid()}
    )
    assert archived.kind == "invalid_state"
    assert (
        err(
            daemon, "process.spawn", {"workspace_id": ws["id"], "kind": "exec", "argv": ["true"]}
        ).kind
        == "invalid_state"
    )
    assert daemon.call("lease.list")["leases"] == []
    assert [p["id"] for p in daemon.call("process.list")["processes"]] == [proc["id"]]


def test_archive_is_busy_naming_holders_and_stop_spares_external_ones(
    daemon: DaemonProcess, tmp_short: Path, external: list[subprocess.Popen[bytes]]
) -> None:
    repo = make_repo(tmp_short / "repo")
    project = add_project(daemon, repo)
    ws = create(daemon, project["id"], "w1")["workspace"]
    term = spawn(daemon, ws["id"], ["sleep", "60"], kind="terminal", pty=True)
    editor = subprocess.Popen(["sleep", "60"], start_new_session=True)
    external.append(editor)
    lease = daemon.call(
        "lease.acquire",
        {"workspace_id": ws["id"], "kind": "editor", "pid": editor.pid, "label": "vim"},
    )["lease"]
    busy = err(daemon, "workspace.archive", {"workspace_id": ws["id"]})
    assert busy.kind == "busy"
    assert f"terminal in pid {term['pid']}" in str(busy)
    assert f"vim in pid {editor.pid}" in str(busy)
    assert {(h["kind"], h["pid"]) for h in busy.data["holders"]} == {
        ("terminal", term["pid"]),
        ("editor", editor.pid),
    }
    # archive {stop: true} stops the daemon's terminal, but the editor still holds it.
    busy = err(daemon, "workspace.archive", {"workspace_id": ws["id"], "stop": True})
    assert busy.kind == "busy" and [h["pid"] for h in busy.data["holders"]] == [editor.pid]
    assert daemon.call("process.get", {"process_id": term["id"]})["process"]["state"] == "exited"
    daemon.call("lease.release", {"lease_id": lease["id"]})
    done = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert done["workspace"]["state"] == "archived"


def test_dead_external_holder_is_reclaimed_without_a_call(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    ws = _direct_workspace(daemon, tmp_short)
    editor = subprocess.Popen(["sleep", "60"], start_new_session=True)
    lease = daemon.call("lease.acquire", {"workspace_id": ws, "kind": "editor", "pid": editor.pid})
    editor.kill()
    editor.wait(10)
    rows = lambda: _lease_rows(daemon.root)  # noqa: E731
    assert [r[0] for r in rows()] == [lease["lease"]["id"]]
    until(lambda: rows() == [], message="the settle loop reclaims the dead holder's lease")


def _direct_workspace(daemon: DaemonProcess, tmp_short: Path) -> str:
    """A workspace row written into the store of a stopped daemon (no git needed)."""
    daemon.terminate()
    ws = insert_workspace(daemon.root, tmp_short / "checkouts" / "w")
    daemon.start()
    return ws


def _lease_rows(root: Path) -> list[tuple[Any, ...]]:
    import sqlite3

    db = sqlite3.connect(root / "state.db")
    try:
        return [tuple(r) for r in db.execute("SELECT id, pid, kind FROM leases").fetchall()]
    finally:
        db.close()


def _stubborn_tree(
    daemon: DaemonProcess, ws: str, kind: str, *, depth: int
) -> tuple[dict[str, Any], list[ProcId]]:
    """A process ignoring SIGTERM with `depth` generations of children; (process, its tree)."""
    proc = spawn(daemon, ws, stubborn_argv(depth), kind=kind)
    until(lambda: len(pids_in(output_text(daemon, proc["id"]))) == depth + 1)
    return proc, identify_all(pids_in(output_text(daemon, proc["id"])))


def test_leases_survive_a_daemon_sigkill_and_children_are_adopted(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    ws = _direct_workspace(daemon, tmp_short)
    agent, pids = _stubborn_tree(daemon, ws, "agent", depth=1)
    daemon.kill()
    assert all(alive(p) for p in pids)
    daemon.start()
    found = daemon.call("process.get", {"process_id": agent["id"]})["process"]
    assert found["adopted"] and found["pid"] == agent["pid"] and found["state"] == "running"
    leases = daemon.call("lease.list", {"workspace_id": ws})["leases"]
    assert [(x["pid"], x["kind"], x["live"]) for x in leases] == [(agent["pid"], "agent", True)]
    holders = daemon.call("process.holders", {"workspace_id": ws})
    assert f"agent in pid {agent['pid']}" in holders["message"]
    started = time.monotonic()
    stopped = daemon.call("process.stop", {"process_id": agent["id"], "grace_s": 0.3})["process"]
    assert time.monotonic() - started < 8
    assert stopped["state"] == "exited" and stopped["exit"]["settled_by"] == "unknown"
    assert not any(alive(p) for p in pids)
    assert daemon.call("lease.list")["leases"] == []


def test_shutdown_kills_a_stubborn_tree_within_the_deadline(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    ws = _direct_workspace(daemon, tmp_short)
    _proc, pids = _stubborn_tree(daemon, ws, "mcp", depth=2)
    started = time.monotonic()
    assert daemon.terminate() == 0
    assert time.monotonic() - started < 8 + 2
    assert not any(alive(p) for p in pids), "a member of the tree survived the shutdown"
    assert _lease_rows(daemon.root) == []


def test_keep_processes_leaves_agents_running_for_the_next_start(
    root: Path, tmp_short: Path
) -> None:
    ws = insert_workspace(root, tmp_short / "checkouts" / "w")
    daemon = DaemonProcess(root, args=["--keep-processes"]).start()
    kept: ProcId | None = None
    try:
        agent = spawn(daemon, ws, ["sleep", "60"], kind="agent")
        kept = identify(agent["pid"])
        cmd = spawn(daemon, ws, ["sleep", "60"])
        stopped = identify(cmd["pid"])
        assert daemon.terminate() == 0
        assert alive(kept) and not alive(stopped)
        daemon.args = []
        daemon.start()
        listed = {
            p["id"]: p for p in daemon.call("process.list", {"workspace_id": ws})["processes"]
        }
        assert list(listed) == [agent["id"]] and listed[agent["id"]]["adopted"]
        daemon.call("process.stop", {"process_id": agent["id"]})
        assert not alive(kept)
    finally:
        daemon.close()
        if kept is not None and alive(kept):
            os.kill(kept.pid, signal.SIGKILL)


def test_crash_between_record_and_gate_runs_nothing(root: Path, tmp_short: Path) -> None:
    checkout = tmp_short / "checkouts" / "w"
    ws = insert_workspace(root, checkout)
    daemon = DaemonProcess(root, env={"XUM_FAULT": "process.spawn.after_record"}).start()
    try:
        with pytest.raises(Exception):  # noqa: B017 - the connection dies with the daemon
            spawn(daemon, ws, ["touch", "ran"])
        assert daemon.wait() == -signal.SIGKILL
        assert len(_lease_rows(root)) == 1  # recorded, with its pid
        daemon.env = {}
        daemon.start()
        assert daemon.call("lease.list")["leases"] == []
        assert daemon.call("process.list")["processes"] == []
        assert not (checkout / "ran").exists()
    finally:
        daemon.close()


def _stopping_foreground_command(daemon: DaemonProcess, ws: str) -> dict[str, Any]:
    """A foreground command that ignores SIGTERM, whose caller went away: it is being stopped."""
    with daemon.client() as owner:
        cmd: dict[str, Any] = owner.call(
            "process.spawn",
            {"workspace_id": ws, "kind": "exec", "argv": stubborn_argv(0), "foreground": True},
        )["process"]
        until(lambda: "pid" in output_text(daemon, cmd["id"]))
    # The caller's connection closed: its foreground command is being stopped.
    until(lambda: process_state(daemon, cmd["id"]) == "stopping")
    return cmd


def _pending_holder_settled(daemon: DaemonProcess, ws: str, cmd: dict[str, Any]) -> str:
    """The unconfirmed stop holds the workspace until the group dies: how it was settled."""
    holders = daemon.call("process.holders", {"workspace_id": ws})["holders"]
    assert [(h["kind"], h["pid"]) for h in holders] == [("pending_stop", cmd["pid"])]
    os.killpg(cmd["pgid"], signal.SIGKILL)
    done = daemon.call("process.wait", {"process_id": cmd["id"], "timeout_s": 10})["process"]
    assert daemon.call("process.holders", {"workspace_id": ws})["holders"] == []
    settled_by: str = done["exit"]["settled_by"]
    return settled_by


def process_state(daemon: DaemonProcess, process_id: str) -> str:
    state: str = daemon.call("process.get", {"process_id": process_id})["process"]["state"]
    return state


def test_refused_background_move_is_settled_by_the_probe(root: Path, tmp_short: Path) -> None:
    write_config(root, CONFIG.replace("stop_grace_s = 0.5", "stop_grace_s = 60"))
    ws = insert_workspace(root, tmp_short / "checkouts" / "w")
    daemon = DaemonProcess(root, env={"XUM_FAULT": "process.exit.unconfirmed"}).start()
    try:
        cmd = _stopping_foreground_command(daemon, ws)
        refused = err(daemon, "process.background", {"process_id": cmd["id"]})
        assert refused.data["state"] == "pending_stop"
        assert _pending_holder_settled(daemon, ws, cmd) == "probe"
    finally:
        daemon.close()


def test_pending_stop_survives_a_daemon_sigkill_until_settled(root: Path, tmp_short: Path) -> None:
    write_config(root, CONFIG.replace("stop_grace_s = 0.5", "stop_grace_s = 60"))
    ws = insert_workspace(root, tmp_short / "checkouts" / "w")
    daemon = DaemonProcess(root).start()
    try:
        cmd = _stopping_foreground_command(daemon, ws)
        stopping = identify(cmd["pid"])
        assert err(daemon, "process.background", {"process_id": cmd["id"]}).data["state"] == (
            "pending_stop"
        )
        daemon.kill()
        assert alive(stopping)
        daemon.start()
        assert _pending_holder_settled(daemon, ws, cmd) == "unknown"
    finally:
        daemon.close()
