"""Rename (journaled git worktree move + default branch rename) and keep."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import git
from tests.support.lifecycle_helpers import (
    assert_git_healthy,
    branch_exists,
    create,
    rpc_error,
    worktrees,
)


def test_rename_moves_checkout_and_default_branch(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "old")["workspace"]
    old_path = Path(ws["path"])
    (old_path / "work.txt").write_text("uncommitted\n")
    result = daemon.call("workspace.rename", {"workspace_id": ws["id"], "name": "new"})
    renamed = result["workspace"]
    new_path = old_path.parent / "new"
    assert result["previous_name"] == "old"
    assert result["branch_renamed"] is True
    assert renamed["name"] == "new"
    assert renamed["path"] == str(new_path)
    assert renamed["branch"] == "xum/new"
    assert renamed["incarnation"] == ws["incarnation"]
    assert not old_path.exists()
    assert (new_path / "work.txt").read_text() == "uncommitted\n"
    entry = worktrees(repo)[str(new_path)]
    assert entry["branch"] == "refs/heads/xum/new"
    assert entry["locked"] == f"xum {ws['id']} {ws['incarnation']}"  # still protected
    assert not branch_exists(repo, "xum/old")
    assert_git_healthy(repo)
    journal = sqlite3.connect(daemon.root / "state.db").execute(
        "SELECT count(*) FROM rename_journal"
    )
    assert journal.fetchone()[0] == 0
    # and the workspace still works: archive + unarchive at the new path
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert (new_path / "work.txt").read_text() == "uncommitted\n"


def test_rename_keeps_a_custom_branch(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "a", branch="feature/login")["workspace"]
    result = daemon.call("workspace.rename", {"workspace_id": ws["id"], "name": "b"})
    assert result["branch_renamed"] is False
    assert result["workspace"]["branch"] == "feature/login"
    assert branch_exists(repo, "feature/login")


def test_rename_archived_workspace(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "arch")["workspace"]
    (Path(ws["path"]) / "w.txt").write_text("w\n")
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    renamed = daemon.call("workspace.rename", {"workspace_id": ws["id"], "name": "arch2"})
    assert renamed["workspace"]["state"] == "archived"
    assert renamed["workspace"]["branch"] == "xum/arch2"
    back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})["workspace"]
    assert back["path"].endswith("/arch2")
    assert (Path(back["path"]) / "w.txt").read_text() == "w\n"


def test_rename_errors(daemon: DaemonProcess, repo: Path, project: dict[str, Any]) -> None:
    a = create(daemon, project["id"], "a")["workspace"]
    create(daemon, project["id"], "b")
    conflict = rpc_error(daemon, "workspace.rename", {"workspace_id": a["id"], "name": "b"})
    assert conflict.kind == "conflict"
    for bad in ("..", "x/y", ".dot", "a..b"):
        err = rpc_error(daemon, "workspace.rename", {"workspace_id": a["id"], "name": bad})
        assert err.kind == "invalid_name", bad
    git(repo, "branch", "xum/c")
    taken = rpc_error(daemon, "workspace.rename", {"workspace_id": a["id"], "name": "c"})
    assert taken.kind == "conflict"
    assert "xum/c" in taken.message
    missing = {"workspace_id": "ws_0123456789abcdef", "name": "z"}
    assert rpc_error(daemon, "workspace.rename", missing).kind == "not_found"
    # nothing moved
    assert Path(a["path"]).is_dir()
    assert daemon.call("workspace.get", {"workspace_id": a["id"]})["workspace"]["name"] == "a"
    assert_git_healthy(repo)


def test_keep_requires_interrupted(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "k")["workspace"]
    err = rpc_error(daemon, "workspace.keep", {"workspace_id": ws["id"]})
    assert err.kind == "invalid_state"
    # The startup pass (after a crash) flags a `creating` row whose setup never finished; do it
    # by hand on a stopped daemon, then Keep makes it active.
    daemon.terminate()
    db = sqlite3.connect(daemon.root / "state.db")
    db.execute(
        "UPDATE workspaces SET state = 'creating', interrupted = 1,"
        " interrupted_reason = 'setup never finished' WHERE id = ?",
        (ws["id"],),
    )
    db.commit()
    db.close()
    daemon.start()
    flagged = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert flagged["interrupted"] is True
    kept = daemon.call("workspace.keep", {"workspace_id": ws["id"]})["workspace"]
    assert kept["interrupted"] is False
    assert kept["state"] == "active"
