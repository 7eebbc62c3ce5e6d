"""A root with records serves before its feature graph is built (xumd.startup.lazy_start, at
once): READY=1 comes when the socket answers, the graph is built right after, and nothing is
answered from records its startup passes have not reconciled (docs/RELIABILITY.md, "Start-up
with records").

The window between READY=1 and the graph is held open by a fault point
(`lazy_start.hold_build`), so each case is an ordered step:
- a request in the window waits, and is answered as the pass left the records;
- `hello` is answered in the window; `daemon.status` waits like the graph's methods;
- a wait past `lock_wait_s` is answered `timeout`, and the build goes on;
- a SIGKILL in the window loses nothing: the next start runs the passes;
- a second daemon in the window is refused (the root lock is taken before READY=1);
- a pending cleanup obligation is retried once the graph is up;
- a kept agent that exits in the window is seen exited at adoption, its lease reclaimed;
- a SIGTERM in the window lets the build finish its passes, then stops cleanly;
- a start-up build that fails is built by the next request (and the passes announced then);
- what the passes held is given back once, after they ran (not also at READY=1, before them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from xum_protocol.errors import ErrorKind
from xumd.app import RECONCILED
from xumd.startup.runner import EXIT_ALREADY_RUNNING

from tests.processes.test_support import insert_workspace
from tests.support.daemon import XUMD, DaemonProcess, write_config
from tests.support.gitrepo import make_repo
from tests.support.holds import hold_env, release, wait_held
from tests.support.lifecycle_helpers import add_project, create
from tests.support.procs import alive, identify
from tests.support.raw import RawPeer
from tests.support.wait import until

HOLD = "lazy_start.hold_build"
HELLO = {"protocol": "1.0"}


def request(peer: RawPeer, request_id: int, method: str, params: Any = None) -> None:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    peer.send_json(message)


def held_start(root: Path, holds: Path, **env: str) -> DaemonProcess:
    """A daemon on `root` past READY=1, held before its feature graph is built."""
    daemon = DaemonProcess(root, log_level="info", env={**hold_env(HOLD, holds), **env})
    daemon.start(wait_ready=False)
    try:
        daemon.wait_for_notify("READY=1")
        wait_held(HOLD, holds)
    except BaseException:
        daemon.close()
        raise
    return daemon


def steps(daemon: DaemonProcess) -> str:
    return "".join(line for line in daemon.log_text().splitlines() if "startup_step" in line)


def test_a_request_in_the_window_waits_for_the_pass(root: Path, tmp_short: Path) -> None:
    # A `creating` row: the pass flags it interrupted; an answer from the unreconciled rows
    # would show it as a create still under way.
    ws = insert_workspace(root, tmp_short / "checkouts" / "w", state="creating")
    holds = tmp_short / "holds"
    daemon = held_start(root, holds)
    try:
        with RawPeer(daemon.socket_path) as peer:
            request(peer, 1, "workspace.list", {})
            request(peer, 2, "daemon.status")
            request(peer, 3, "hello", HELLO)
            first = peer.read()
            # `hello` is answered in the window; the two before it wait for the graph.
            assert first["id"] == 3 and "result" in first
            assert "recovery" not in steps(daemon)
            release(HOLD, holds)
            answers = {a["id"]: a for a in (peer.read(), peer.read())}
        (listed,) = answers[1]["result"]["workspaces"]
        assert listed["id"] == ws and listed["interrupted"] is True
        assert answers[2]["result"]["details"]["recovery"]["last_pass"]["rows"] == 1
        daemon.wait_for_notify(RECONCILED)
    finally:
        daemon.close()


def test_a_wait_past_lock_wait_s_is_a_timeout(root: Path, tmp_short: Path) -> None:
    insert_workspace(root, tmp_short / "checkouts" / "w")
    write_config(root, "lock_wait_s = 0.2\n")
    holds = tmp_short / "holds"
    daemon = held_start(root, holds)
    try:
        with RawPeer(daemon.socket_path) as peer:
            request(peer, 1, "workspace.list", {})
            refused = peer.read()["error"]
            assert refused["data"]["kind"] == ErrorKind.TIMEOUT.value
            assert "start-up" in refused["message"]
            release(HOLD, holds)
            daemon.wait_for_notify(RECONCILED)
            request(peer, 2, "workspace.list", {})
            assert len(peer.read()["result"]["workspaces"]) == 1
    finally:
        daemon.close()


def test_a_sigkill_in_the_window_leaves_the_pass_to_the_next_start(
    root: Path, tmp_short: Path
) -> None:
    ws = insert_workspace(root, tmp_short / "checkouts" / "w", state="creating")
    daemon = held_start(root, tmp_short / "holds")
    daemon.kill()
    again = DaemonProcess(root, log_level="info").start()
    try:
        (listed,) = again.call("workspace.list", {})["workspaces"]
        assert listed["id"] == ws and listed["interrupted"] is True
        assert '"step": "recovery"' in steps(again)
    finally:
        again.close()
        daemon.close()


def test_a_second_daemon_in_the_window_is_refused(root: Path, tmp_short: Path) -> None:
    insert_workspace(root, tmp_short / "checkouts" / "w")
    holds = tmp_short / "holds"
    daemon = held_start(root, holds)
    try:
        second = subprocess.run(
            [*XUMD, "--root", str(root)], capture_output=True, text=True, timeout=60
        )
        assert second.returncode == EXIT_ALREADY_RUNNING, second.stderr
        release(HOLD, holds)
        daemon.wait_for_notify(RECONCILED)
        assert len(daemon.call("workspace.list", {})["workspaces"]) == 1
    finally:
        daemon.close()


def test_a_pending_obligation_is_retried_once_the_graph_is_up(root: Path, tmp_short: Path) -> None:
    # Killed after archive committed its cleanup obligations, before it ran them: the next
    # start has them pending and due.
    write_config(root, "[cleanup]\npoll_interval_s = 0.2\n")
    first = DaemonProcess(root, env={"XUM_FAULT": "workspace.archive.after_commit"}).start()
    try:
        project = add_project(first, make_repo(tmp_short / "repo"))
        made = create(first, project["id"], "w")["workspace"]
        ws, checkout = made["id"], Path(made["path"])
        with pytest.raises(Exception):  # noqa: B017 - the daemon dies at the point: any error
            first.call("workspace.archive", {"workspace_id": ws})
        assert first.wait() == -signal.SIGKILL
    finally:
        first.close()
    holds = tmp_short / "holds"
    daemon = held_start(root, holds)
    try:
        assert checkout.exists()  # nothing ran in the window
        release(HOLD, holds)

        until(
            lambda: not daemon.call("cleanup.list", {"state": "pending"})["obligations"],
            timeout=30,
            message="the retry completes the archive's cleanup",
        )
        assert not checkout.exists()
    finally:
        daemon.close()


def test_a_kept_agent_that_exits_in_the_window_is_seen_at_adoption(
    root: Path, tmp_short: Path
) -> None:
    ws = insert_workspace(root, tmp_short / "checkouts" / "w")
    daemon = DaemonProcess(root, args=["--keep-processes"]).start()
    params = {"workspace_id": ws, "kind": "agent", "argv": ["sleep", "60"]}
    agent = daemon.call("process.spawn", params)["process"]
    kept = identify(agent["pid"])
    assert daemon.terminate() == 0 and alive(kept)
    daemon.close()
    holds = tmp_short / "holds"
    again = held_start(root, holds)
    try:
        os.kill(kept.pid, signal.SIGKILL)
        until(lambda: not alive(kept), message="the agent exits in the window")
        release(HOLD, holds)
        again.wait_for_notify(RECONCILED)
        found = again.call("process.get", {"process_id": agent["id"]})["process"]
        assert found["state"] == "exited", found
        assert again.call("lease.list", {})["leases"] == []
    finally:
        again.close()
        if alive(kept):
            os.kill(kept.pid, signal.SIGKILL)


def test_a_sigterm_in_the_window_lets_the_passes_finish(root: Path, tmp_short: Path) -> None:
    ws = insert_workspace(root, tmp_short / "checkouts" / "w", state="creating")
    holds = tmp_short / "holds"
    daemon = held_start(root, holds)
    try:
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.wait_for_notify("STOPPING=1")
        release(HOLD, holds)
        assert daemon.wait() == 0
        assert '"step": "recovery"' in steps(daemon)
    finally:
        daemon.close()
    again = DaemonProcess(root).start()
    try:
        (listed,) = again.call("workspace.list", {})["workspaces"]
        assert listed["id"] == ws and listed["interrupted"] is True
    finally:
        again.close()


def test_a_failed_start_up_build_is_built_by_the_next_request(root: Path, tmp_short: Path) -> None:
    ws = insert_workspace(root, tmp_short / "checkouts" / "w", state="creating")
    daemon = DaemonProcess(root, log_level="info", env={"XUM_FAULT": "lazy_start.build_fails"})
    daemon.start(wait_ready=False)
    try:
        daemon.wait_for_notify("READY=1")
        until(lambda: "lazy_start.build_failed" in daemon.log_text(), message="the failed build")
        # The next request builds the graph and runs its passes before it is answered.
        (listed,) = daemon.call("workspace.list", {})["workspaces"]
        assert listed["id"] == ws and listed["interrupted"] is True
        daemon.wait_for_notify(RECONCILED)
    finally:
        daemon.close()


def test_the_startup_memory_is_released_once_after_the_passes(root: Path, tmp_short: Path) -> None:
    insert_workspace(root, tmp_short / "checkouts" / "w")
    daemon = DaemonProcess(root, log_level="info").start()  # till RECONCILED
    daemon.close()
    lines = daemon.log_text().splitlines()
    names = [json.loads(line)["event"] for line in lines if line.startswith("{")]
    assert names.count("daemon.startup_memory_released") == 1
    released = names.index("daemon.startup_memory_released")
    assert names.index("daemon.ready") < names.index("lazy_start.features_built") < released
