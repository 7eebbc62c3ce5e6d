"""When a workspace was last held (`workspace_activity`, what the disk budget's idleness reads):
stamped as its last lease goes, released with the workspace's row, and never stamped for a
workspace whose row is gone (a removed workspace's teardown ending under its lease). A real
daemon, a real holder process, a real teardown script."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import git
from tests.support.lifecycle_helpers import add_project, create


def _stamps(root: Path) -> dict[str, float]:
    db = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True)
    try:
        return dict(db.execute("SELECT workspace_id, held_at FROM workspace_activity").fetchall())
    finally:
        db.close()


def test_a_stamp_goes_with_its_workspace_and_none_is_made_after_it(
    tmp_short: Path, repo: Path
) -> None:
    (repo / ".xum").mkdir(exist_ok=True)
    (repo / ".xum" / "config.toml").write_text('[scripts]\nteardown = ["sleep 0.2"]\n')
    git(repo, "add", ".xum")
    git(repo, "commit", "-q", "-m", "teardown")
    daemon = DaemonProcess(tmp_short / "root").start()
    holder = subprocess.Popen(["sleep", "60"])
    try:
        project = add_project(daemon, repo)
        daemon.call("project.trust", {"project_id": project["id"]})
        ws = create(daemon, project["id"], "held")["workspace"]
        lease = daemon.call(
            "lease.acquire", {"workspace_id": ws["id"], "kind": "editor", "pid": holder.pid}
        )["lease"]
        daemon.call("lease.release", {"lease_id": lease["id"]})
        assert list(_stamps(daemon.root)) == [ws["id"]]
        # The row goes, and its stamp with it; its teardown then runs (after the row) under a
        # lease of its own, whose end stamps nothing and fails nothing.
        removed = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
        assert removed["cleanup"]["status"] == "completed", removed["cleanup"]
        assert _stamps(daemon.root) == {}
        assert daemon.call("daemon.status")["pid"] == daemon.pid
    finally:
        holder.kill()
        holder.wait(10)
        daemon.close()
