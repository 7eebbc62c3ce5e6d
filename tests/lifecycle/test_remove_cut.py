"""A removal of an archived workspace whose checkout still lingers (its cleanup pending), cut by
a SIGKILL after its intent: the restarted daemon puts the workspace back where the removal
began, archived (flagged), with its cleanup still pending; never `active` over the lingering
checkout. A real daemon, a real teardown that fails, a real SIGKILL."""

from __future__ import annotations

from pathlib import Path

import pytest
from xum_client.errors import XumClientError

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import add_project, create


def test_a_cut_removal_of_an_archived_workspace_with_a_lingering_checkout_stays_archived(
    tmp_short: Path,
) -> None:
    repo = make_repo(tmp_short / "repo")
    (repo / ".xum").mkdir()
    (repo / ".xum" / "config.toml").write_text('[scripts]\nteardown = ["exit 3"]\n')
    git(repo, "add", ".xum")
    git(repo, "commit", "-q", "-m", "a teardown that fails")
    root = tmp_short / "root"
    # The failed teardown is retried only in minutes: the archived checkout lingers meanwhile.
    write_config(root, "[cleanup]\nbackoff_initial_s = 600\nbackoff_max_s = 1200\n")
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        daemon.call("project.trust", {"project_id": project["id"]})
        ws = create(daemon, project["id"], "a")["workspace"]
        archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        assert archived["cleanup"]["status"] == "pending", archived["cleanup"]
        assert Path(ws["path"]).is_dir()
        daemon.close()

        daemon = DaemonProcess(root, env={"XUM_FAULT": "workspace.remove.after_intent"}).start()
        with pytest.raises((XumClientError, OSError)):
            daemon.call("workspace.remove", {"workspace_id": ws["id"]})
        assert daemon.wait() == -9  # killed at the fault point, after the intent committed

        daemon = DaemonProcess(root).start()
        got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
        assert got["state"] == "archived", got
        assert got["interrupted"] is True
        assert "removal was interrupted" in (got["interrupted_reason"] or "")
        assert Path(ws["path"]).is_dir()  # nothing deleted: the removal never committed
        pending = daemon.call("cleanup.list", {"workspace_id": ws["id"]})["obligations"]
        assert {o["state"] for o in pending} == {"pending"}, pending
        # The user settles it as any flagged workspace: keep, then remove.
        daemon.call("workspace.keep", {"workspace_id": ws["id"]})
        removed = daemon.call("workspace.remove", {"workspace_id": ws["id"]})
        assert removed["removed"] is True
    finally:
        daemon.close()
