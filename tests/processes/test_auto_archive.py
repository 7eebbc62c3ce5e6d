"""Auto-archive on agent exit, through the normal archive path, with retries when busy."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project, create
from tests.support.wait import until

CONFIG = (
    "stop_grace_s = 0.5\n[processes]\nprobe_interval_s = 0.1\n"
    "auto_archive_backoff_initial_s = 0.05\nauto_archive_backoff_max_s = 0.2\n"
    "auto_archive_attempts = 200\n"
)


@pytest.fixture
def root(tmp_short: Path) -> Path:
    write_config(tmp_short / "root", CONFIG)
    return tmp_short / "root"


@pytest.fixture
def project(daemon: DaemonProcess, tmp_short: Path) -> dict[str, Any]:
    return add_project(daemon, make_repo(tmp_short / "repo"))


def state(daemon: DaemonProcess, ws: str) -> str:
    found: str = daemon.call("workspace.get", {"workspace_id": ws})["workspace"]["state"]
    return found


def outcome(root: Path, ws: str) -> dict[str, Any] | None:
    db = sqlite3.connect(root / "state.db")
    try:
        row = db.execute(
            "SELECT auto_archive_outcome FROM workspaces WHERE id = ?", (ws,)
        ).fetchone()
    finally:
        db.close()
    return json.loads(row[0]) if row and row[0] else None


def agent(daemon: DaemonProcess, ws: str, argv: list[str]) -> dict[str, Any]:
    params = {"workspace_id": ws, "kind": "agent", "argv": argv}
    process: dict[str, Any] = daemon.call("process.spawn", params)["process"]
    return process


def test_agent_exit_zero_archives_and_reports(
    daemon: DaemonProcess, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "auto", auto_archive="on_agent_exit")["workspace"]["id"]
    with daemon.client(timeout=20) as events:
        events.call("events.subscribe", {"types": ["workspace.auto_archive"]})
        agent(daemon, ws, ["true"])
        until(lambda: state(daemon, ws) == "archived", message="auto-archived")
        note = events.next_notification()
    assert note["params"]["data"]["outcome"]["status"] == "archived"
    assert note["params"]["data"]["workspace_id"] == ws
    found = outcome(daemon.root, ws)
    assert found is not None and found["status"] == "archived" and found["attempts"] == 1


def test_failing_agent_or_plain_workspace_is_not_archived(
    daemon: DaemonProcess, project: dict[str, Any]
) -> None:
    auto = create(daemon, project["id"], "auto", auto_archive="on_agent_exit")["workspace"]["id"]
    plain = create(daemon, project["id"], "plain")["workspace"]["id"]
    failing = agent(daemon, auto, ["false"])
    fine = agent(daemon, plain, ["true"])
    for proc in (failing, fine):
        daemon.call("process.wait", {"process_id": proc["id"], "timeout_s": 10})
    # A later, successful exec (not an agent) must not archive either.
    done = daemon.call("process.spawn", {"workspace_id": auto, "kind": "exec", "argv": ["true"]})[
        "process"
    ]
    daemon.call("process.wait", {"process_id": done["id"], "timeout_s": 10})
    assert state(daemon, auto) == "active" and state(daemon, plain) == "active"
    assert outcome(daemon.root, auto) is None


def test_busy_workspace_is_retried_until_it_can_be_archived(
    daemon: DaemonProcess, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "auto", auto_archive="on_agent_exit")["workspace"]["id"]
    term = daemon.call(
        "process.spawn",
        {"workspace_id": ws, "kind": "terminal", "argv": ["sleep", "60"], "pty": True},
    )["process"]
    agent(daemon, ws, ["true"])
    retrying = until(
        lambda: (o := outcome(daemon.root, ws)) and o["status"] == "retrying" and o,
        message="a busy refusal, retried",
    )
    assert "busy" in retrying["error"] and f"pid {term['pid']}" in retrying["error"]
    assert state(daemon, ws) == "active"
    daemon.call("process.stop", {"process_id": term["id"]})
    until(lambda: state(daemon, ws) == "archived", message="archived after the retry")
    # The state commits before the archive's cleanup ends; the outcome is recorded after it.
    final = until(
        lambda: (o := outcome(daemon.root, ws)) and o["status"] != "retrying" and o,
        message="the outcome recorded",
    )
    assert final["status"] == "archived" and final["attempts"] > 1
