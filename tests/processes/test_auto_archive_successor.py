"""Audit: an auto-archive owed to one incarnation's agent never archives a later incarnation.

The agent exits 0 while its workspace is busy (a terminal), so the auto-archive is retried after a
backoff. Before the retry, the user archives and unarchives the workspace themselves: a new
incarnation, restored on purpose. The pending retry belongs to the old incarnation's agent; acting
on the new one would be successor harm (invariant 4). It ends as `superseded`, naming why.

The retry is held at a simulate fault point (processes.auto_archive.hold_retry) until the test has
restored the workspace, so the order does not depend on beating a backoff window.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import make_repo
from tests.support.holds import hold_env, release, wait_held
from tests.support.lifecycle_helpers import add_project, create
from tests.support.wait import until

HOLD = "processes.auto_archive.hold_retry"
CONFIG = (
    "stop_grace_s = 0.5\n[processes]\nprobe_interval_s = 0.1\n"
    "auto_archive_backoff_initial_s = 0.01\nauto_archive_backoff_max_s = 0.01\n"
    "auto_archive_attempts = 3\n"
)


@pytest.fixture
def root(tmp_short: Path) -> Path:
    write_config(tmp_short / "root", CONFIG)
    return tmp_short / "root"


@pytest.fixture
def holds(tmp_short: Path) -> Path:
    return tmp_short / "holds"


@pytest.fixture
def daemon(root: Path, holds: Path) -> Iterator[DaemonProcess]:
    proc = DaemonProcess(root, env=hold_env(HOLD, holds)).start()
    yield proc
    proc.close()


@pytest.fixture
def project(daemon: DaemonProcess, tmp_short: Path) -> dict[str, Any]:
    return add_project(daemon, make_repo(tmp_short / "repo"))


def outcome(root: Path, ws: str) -> dict[str, Any] | None:
    db = sqlite3.connect(root / "state.db")
    try:
        row = db.execute(
            "SELECT auto_archive_outcome FROM workspaces WHERE id = ?", (ws,)
        ).fetchone()
    finally:
        db.close()
    return json.loads(row[0]) if row and row[0] else None


def test_a_retried_auto_archive_leaves_a_restored_incarnation_alone(
    daemon: DaemonProcess, project: dict[str, Any], holds: Path
) -> None:
    ws = create(daemon, project["id"], "auto", auto_archive="on_agent_exit")["workspace"]
    term = daemon.call(
        "process.spawn",
        {"workspace_id": ws["id"], "kind": "terminal", "argv": ["sleep", "60"], "pty": True},
    )["process"]
    daemon.call("process.spawn", {"workspace_id": ws["id"], "kind": "agent", "argv": ["true"]})
    retrying = until(
        lambda: (o := outcome(daemon.root, ws["id"])) and o["status"] == "retrying" and o,
        message="a busy refusal, retried later",
    )
    wait_held(HOLD, holds)
    # The user's own archive and unarchive, while the retry is held.
    daemon.call("process.stop", {"process_id": term["id"]})
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    restored = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})["workspace"]
    assert restored["incarnation"] != ws["incarnation"]
    assert outcome(daemon.root, ws["id"]) == retrying, "the retry ran before it was released"
    release(HOLD, holds)

    final = until(
        lambda: (o := outcome(daemon.root, ws["id"])) and o["attempts"] > 1 and o,
        message="the retry to run",
    )
    got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert got["state"] == "active", final
    assert got["incarnation"] == restored["incarnation"]
    assert final["status"] == "superseded" and "incarnation" in (final["error"] or ""), final
    assert retrying["process_id"] == final["process_id"]
