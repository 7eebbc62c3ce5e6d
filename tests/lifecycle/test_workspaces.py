"""Projects and workspaces against a real daemon and real git repositories."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import (
    assert_git_healthy,
    branch_exists,
    create,
    rpc_error,
    worktrees,
)
from tests.support.wait import until


@pytest.fixture
def repo(tmp_short: Path) -> Path:
    return make_repo(tmp_short / "repo", {"README.md": "hello\n", ".gitignore": "ignored/\n"})


# -- projects ------------------------------------------------------------------------------------


def test_project_add_list_get(daemon: DaemonProcess, repo: Path, project: dict[str, Any]) -> None:
    assert project["id"].startswith("prj_")
    assert project["path"] == os.path.realpath(repo)
    assert project["kind"] == "git"
    assert project["name"] == "repo"
    listed = daemon.call("project.list")["projects"]
    assert [p["id"] for p in listed] == [project["id"]]
    assert daemon.call("project.get", {"project_id": project["id"]})["project"] == project


def test_project_add_twice_through_other_spellings_is_conflict(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any], tmp_short: Path
) -> None:
    link = tmp_short / "link"
    link.symlink_to(repo)
    for spelling in (str(repo), str(link), str(repo / ".." / "repo"), str(repo) + "/"):
        err = rpc_error(daemon, "project.add", {"path": spelling, "name": "other"})
        assert err.kind == "conflict", spelling
        assert project["id"] in err.message
    assert len(daemon.call("project.list")["projects"]) == 1


def test_project_errors(daemon: DaemonProcess, tmp_short: Path, repo: Path) -> None:
    assert rpc_error(daemon, "project.add", {"path": "relative/path"}).kind == "invalid_path"
    missing = str(tmp_short / "missing")
    assert rpc_error(daemon, "project.add", {"path": missing}).kind == "invalid_path"
    sub = repo / "sub"
    sub.mkdir()
    assert rpc_error(daemon, "project.add", {"path": str(sub)}).kind == "invalid_path"
    bad = rpc_error(daemon, "project.add", {"path": str(repo), "name": "../x"})
    assert bad.kind == "invalid_name"
    assert rpc_error(daemon, "project.get", {"project_id": "prj_0123456789abcdef"}).kind == (
        "not_found"
    )
    assert rpc_error(daemon, "project.get", {"project_id": "ws_0123456789abcdef"}).kind == (
        "invalid_scope"
    )


# -- create / list / get -------------------------------------------------------------------------


def test_create_worktree(daemon: DaemonProcess, repo: Path, project: dict[str, Any]) -> None:
    head = git(repo, "rev-parse", "HEAD").strip()
    result = create(daemon, project["id"], "feat-1")
    ws = result["workspace"]
    assert ws["id"].startswith("ws_")
    assert ws["state"] == "active"
    assert ws["branch"] == "xum/feat-1"
    assert ws["base"] == head
    assert ws["runtime"] == "worktree"
    assert ws["interrupted"] is False
    assert result["setup"]["status"] == "none"
    path = Path(ws["path"])
    assert path == daemon.root / "workspaces" / "repo" / "feat-1"
    assert (path / "README.md").read_text() == "hello\n"
    # git's own view: a locked worktree whose reason is the marker, on the new branch.
    entry = worktrees(repo)[str(path)]
    assert entry["branch"] == "refs/heads/xum/feat-1"
    assert entry["locked"] == f"xum {ws['id']} {ws['incarnation']}"
    assert_git_healthy(repo)
    # the user's repository is untouched
    assert git(repo, "status", "--porcelain") == ""
    got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert got == ws
    listed = daemon.call("workspace.list", {"project_id": project["id"]})["workspaces"]
    assert [w["id"] for w in listed] == [ws["id"]]
    assert daemon.call("workspace.list", {"state": "archived"})["workspaces"] == []


def test_create_with_branch_and_base(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    first = git(repo, "rev-parse", "HEAD").strip()
    (repo / "two.txt").write_text("2\n")
    git(repo, "add", "two.txt")
    git(repo, "commit", "-q", "-m", "two")
    ws = create(daemon, project["id"], "old", branch="topic/x", base=first)["workspace"]
    assert ws["branch"] == "topic/x"
    assert ws["base"] == first
    assert not (Path(ws["path"]) / "two.txt").exists()
    assert git(repo, "rev-parse", "topic/x").strip() == first


def test_create_errors(daemon: DaemonProcess, repo: Path, project: dict[str, Any]) -> None:
    pid = project["id"]
    for bad in ("", ".hidden", "-x", "a/b", "a..b", "x" * 65, "sp ace", "nul\0"):
        assert rpc_error(daemon, "workspace.create", {"project_id": pid, "name": bad}).kind in (
            "invalid_name",
            "invalid_params",
        ), bad
    assert rpc_error(daemon, "workspace.create", {"project_id": pid, "name": "a..b"}).kind == (
        "invalid_name"
    )
    create(daemon, pid, "dup")
    assert rpc_error(daemon, "workspace.create", {"project_id": pid, "name": "dup"}).kind == (
        "conflict"
    )
    unknown = {"project_id": "prj_0000000000000000", "name": "x"}
    assert rpc_error(daemon, "workspace.create", unknown).kind == "not_found"
    scope = {"project_id": "ws_0000000000000000", "name": "x"}
    assert rpc_error(daemon, "workspace.create", scope).kind == "invalid_scope"
    missing_base = {"project_id": pid, "name": "nb", "base": "no-such-ref"}
    assert rpc_error(daemon, "workspace.create", missing_base).kind == "not_found"
    assert rpc_error(daemon, "workspace.get", {"workspace_id": "ws_0000000000000000"}).kind == (
        "not_found"
    )
    assert rpc_error(daemon, "workspace.get", {"workspace_id": pid}).kind == "invalid_scope"
    # nothing half-made: only "dup" exists, in the store and in git
    names = [w["name"] for w in daemon.call("workspace.list")["workspaces"]]
    assert names == ["dup"]
    assert not branch_exists(repo, "xum/nb")
    assert_git_healthy(repo)


def test_failed_create_undoes_its_branch_and_row(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    # The branch `taken` is checked out in the main repository: `git worktree add` of it fails.
    git(repo, "checkout", "-q", "-b", "taken")
    err = rpc_error(
        daemon, "workspace.create", {"project_id": project["id"], "name": "w", "branch": "taken"}
    )
    assert err.kind == "operation_failed"
    assert "already" in err.message  # git's cause is in the answer
    assert daemon.call("workspace.list")["workspaces"] == []
    assert not (daemon.root / "workspaces" / "repo" / "w").exists()
    assert branch_exists(repo, "taken")  # not ours: kept
    assert_git_healthy(repo)
    assert set(worktrees(repo)) == {os.path.realpath(repo)}


def test_failed_create_with_new_branch_undoes_worktree_and_branch(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    # A failing post-checkout hook makes `git worktree add -b` fail *after* it created the
    # branch and the checkout: the create must undo exactly both.
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text("#!/bin/sh\necho hook-says-no\nexit 3\n")
    hook.chmod(0o755)
    err = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "w"})
    assert err.kind == "operation_failed"
    assert "hook-says-no" in err.message
    assert not branch_exists(repo, "xum/w")
    assert not (daemon.root / "workspaces" / "repo" / "w").exists()
    assert set(worktrees(repo)) == {os.path.realpath(repo)}
    assert_git_healthy(repo)
    assert daemon.call("workspace.list")["workspaces"] == []
    hook.unlink()
    assert create(daemon, project["id"], "w")["workspace"]["state"] == "active"


def test_create_refuses_an_occupied_path(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    target_parent = daemon.root / "workspaces" / "repo"
    target_parent.mkdir(parents=True)
    blocker = target_parent / "w"
    blocker.write_text("in the way")
    err = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "w"})
    assert err.kind == "conflict"
    assert blocker.read_text() == "in the way"
    assert not branch_exists(repo, "xum/w")
    assert daemon.call("workspace.list")["workspaces"] == []


def test_create_directory_runtime(
    daemon: DaemonProcess, project: dict[str, Any], tmp_short: Path
) -> None:
    made = create(daemon, project["id"], "plain", runtime="directory")
    assert made["materialised"] == "directory"
    ws = made["workspace"]
    path = Path(ws["path"])
    assert path.is_dir()
    marker = (path / ".xum-incarnation").read_text().strip()
    assert marker == f"xum {ws['id']} {ws['incarnation']}"
    assert ws["branch"] is None


def test_get_shows_the_auto_archive_setting_and_its_outcome(
    daemon: DaemonProcess, project: dict[str, Any]
) -> None:
    plain = create(daemon, project["id"], "plain")["workspace"]
    assert plain["auto_archive"] is None and plain["auto_archive_outcome"] is None
    auto = create(daemon, project["id"], "auto", auto_archive="on_agent_exit")["workspace"]
    assert auto["auto_archive"] == "on_agent_exit" and auto["auto_archive_outcome"] is None
    params = {"workspace_id": auto["id"], "kind": "agent", "argv": ["true"]}
    agent = daemon.call("process.spawn", params)["process"]

    def outcome() -> dict[str, Any] | None:
        got = daemon.call("workspace.get", {"workspace_id": auto["id"]})["workspace"]
        found: dict[str, Any] | None = got["auto_archive_outcome"]
        return found if found and found["status"] == "archived" else None

    found = until(outcome, message="the auto-archive outcome on workspace.get")
    assert found["attempts"] == 1 and found["process_id"] == agent["id"] and found["error"] is None
    listed = daemon.call("workspace.list", {"project_id": project["id"]})["workspaces"]
    by_name = {w["name"]: w for w in listed}
    assert by_name["auto"]["state"] == "archived"
    assert by_name["auto"]["auto_archive_outcome"]["status"] == "archived"
    assert by_name["plain"]["auto_archive_outcome"] is None
