"""project.remove goes through workspace.remove for each workspace; events and snapshots."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import (
    add_project,
    assert_git_healthy,
    branch_exists,
    create,
    rpc_error,
)


@pytest.fixture
def repo(tmp_short: Path) -> Path:
    return make_repo(tmp_short / "repo")


def test_project_remove_removes_each_workspace_the_same_way(
    daemon: DaemonProcess, repo: Path
) -> None:
    project = add_project(daemon, repo)
    a = create(daemon, project["id"], "a")["workspace"]
    b = create(daemon, project["id"], "b")["workspace"]
    daemon.call("workspace.archive", {"workspace_id": b["id"]})
    (Path(a["path"]) / "dirty.txt").write_text("d\n")

    refused = rpc_error(daemon, "project.remove", {"project_id": project["id"]})
    assert refused.kind == "not_safe"
    (outcome,) = refused.data["workspaces"]  # only the one that refused, and nothing removed
    assert outcome["name"] == "a" and outcome["error"]["kind"] == "not_safe"
    assert daemon.call("project.get", {"project_id": project["id"]})["project"]["id"]
    left = {w["name"]: w["state"] for w in daemon.call("workspace.list", {})["workspaces"]}
    assert left == {"a": "active", "b": "archived"}

    result = daemon.call("project.remove", {"project_id": project["id"], "force": True})
    assert result["removed"] is True
    outcomes = {w["name"]: w for w in result["workspaces"]}
    assert outcomes["b"]["ok"] is True  # removed through the very same path
    only = outcomes["a"]
    assert only["ok"] is True
    assert only["result"]["snapshot"]["files"] == ["dirty.txt"]
    assert only["result"]["cleanup"]["status"] == "completed"
    assert not Path(a["path"]).exists()
    # the repository itself and the branches are untouched
    assert (repo / "README.md").read_text() == "hello\n"
    assert branch_exists(repo, "xum/a") and branch_exists(repo, "xum/b")
    assert git(repo, "status", "--porcelain") == ""
    assert_git_healthy(repo)
    assert rpc_error(daemon, "project.get", {"project_id": project["id"]}).kind == "not_found"
    assert rpc_error(daemon, "project.remove", {"project_id": project["id"]}).kind == "not_found"
    # and it can be added again
    assert add_project(daemon, repo)["path"] == project["path"]


def test_events_and_subscription_snapshot(daemon: DaemonProcess, repo: Path) -> None:
    with daemon.client() as sub:
        first = sub.call("events.subscribe", {})
        assert first["snapshot"]["projects"] == []
        assert first["snapshot"]["workspaces"] == []
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "ev")["workspace"]
        daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        daemon.call("workspace.remove", {"workspace_id": ws["id"]})
        seen: list[dict[str, Any]] = []
        while not any(e["type"] == "workspace.removed" for e in seen):
            message = sub.next_notification()
            if message.get("method") == "event":
                seen.append(message["params"])
    seqs = [e["seq"] for e in seen]
    assert seqs == sorted(seqs) and seqs[0] > first["seq"]
    states = [
        e["data"]["workspace"]["state"]
        for e in seen
        if e["type"] == "workspace.state_changed" and e["data"]["workspace"]["id"] == ws["id"]
    ]
    assert states[:1] == ["active"]
    assert "archiving" in states and "archived" in states and "removing" in states
    types = [e["type"] for e in seen]
    assert types[0] == "project.added"
    assert "workspace.created" in types
    with daemon.client() as later:
        snap = later.call("events.subscribe", {})["snapshot"]
    assert [p["id"] for p in snap["projects"]] == [project["id"]]
    assert snap["workspaces"] == []


def test_one_repository_is_one_project_whichever_spelling(
    daemon: DaemonProcess, repo: Path, tmp_short: Path
) -> None:
    """A `.git` file pointing at R, a linked worktree of R, and R itself share R's git common
    dir: only the first is a project, the others are `conflict` naming it."""
    fake = tmp_short / "fake"
    fake.mkdir()
    (fake / ".git").write_text(f"gitdir: {repo / '.git'}\n")
    first = add_project(daemon, fake)
    error = rpc_error(daemon, "project.add", {"path": str(repo), "name": "real"})
    assert error.kind == "conflict", error
    assert first["id"] in str(error) and error.data["id"] == first["id"]
    linked = tmp_short / "linked"
    git(repo, "worktree", "add", "-q", "--detach", str(linked))
    assert rpc_error(daemon, "project.add", {"path": str(linked)}).kind == "conflict"
    assert [p["id"] for p in daemon.call("project.list", {})["projects"]] == [first["id"]]
    # Once that project is removed, the repository can be added again.
    daemon.call("project.remove", {"project_id": first["id"]})
    assert add_project(daemon, repo)["path"] == str(repo.resolve())


def test_project_rows_from_before_the_git_identity_are_checked_too(
    root: Path, repo: Path, tmp_short: Path
) -> None:
    """A project recorded before its git common dir was (NULL columns) still conflicts."""
    daemon = DaemonProcess(root).start()
    project = add_project(daemon, repo)
    daemon.close()
    db = sqlite3.connect(root / "state.db")
    with db:
        db.execute("UPDATE projects SET git_dir = NULL, git_dev = NULL, git_ino = NULL")
    db.close()
    fake = tmp_short / "fake"
    fake.mkdir()
    (fake / ".git").write_text(f"gitdir: {repo / '.git'}\n")
    daemon = DaemonProcess(root).start()
    try:
        error = rpc_error(daemon, "project.add", {"path": str(fake)})
        assert error.kind == "conflict" and error.data["id"] == project["id"], error
    finally:
        daemon.close()
