"""The reclaim lane starts as soon as the trash step it waits for finishes: the finisher pokes it
and releases the reclaim its earlier look deferred, so "remove, then reclaimed" does not wait out
`backoff_initial_s` (the lane's "blocked, never spin" delay). A real daemon, real git."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project, create
from tests.support.wait import until

# A lane that is not poked sleeps an hour: only the poke can reclaim within the test's deadline.
SLOW_LANES = "[cleanup]\nbackoff_initial_s = 3600\nbackoff_max_s = 7200\nbackoff_jitter = 0\n"


def _obligations(daemon: DaemonProcess, wid: str) -> dict[str, dict[str, Any]]:
    listed = daemon.call("cleanup.list", {"workspace_id": wid})["obligations"]
    return {o["kind"]: o for o in listed}


def test_remove_is_reclaimed_at_once_though_the_lane_backs_off_an_hour(
    tmp_short: Path, root: Path
) -> None:
    repo = make_repo(tmp_short / "repo", {"README.md": "hi\n"})
    write_config(root, SLOW_LANES)
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        for n in range(3):
            # Several in a row: each remove's registry event wakes the reclaim lane while its
            # trash step is still owed, which is what deferred the reclaim by the backoff.
            ws = create(daemon, project["id"], f"w{n}")["workspace"]
            (Path(ws["path"]) / "big").mkdir()
            (Path(ws["path"]) / "big" / "blob").write_bytes(b"x" * 65536)
            result = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
            assert result["cleanup"]["status"] == "completed", result
            until(
                lambda wid=ws["id"]: _obligations(daemon, wid)["reclaim"]["state"] == "completed",
                timeout=15.0,
                message="the reclaim of the removed checkout (the lane sleeps an hour unpoked)",
            )
            reclaim = _obligations(daemon, ws["id"])["reclaim"]
            assert reclaim["bytes"] >= 65536, reclaim
            assert list((root / "trash").iterdir()) == []
        assert daemon.call("daemon.status")["details"]["cleanup"]["pending"] == 0
    finally:
        daemon.close()
