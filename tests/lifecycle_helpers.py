"""Shared helpers of the lifecycle tests: a daemon, a real repository, git's own view."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from xum_client.errors import XumRpcError

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import git


def rpc_error(daemon: DaemonProcess, method: str, params: dict[str, Any]) -> XumRpcError:
    with pytest.raises(XumRpcError) as info:
        daemon.call(method, params)
    return info.value


def worktrees(repo: Path) -> dict[str, dict[str, str]]:
    """`git worktree list --porcelain` as {path: {key: value}}."""
    found: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in [*git(repo, "worktree", "list", "--porcelain").splitlines(), ""]:
        if not line:
            if current:
                found[current["worktree"]] = current
            current = {}
            continue
        key, _, value = line.partition(" ")
        current[key] = value
    return found


def assert_git_healthy(repo: Path) -> None:
    """git's own view: nothing to prune, fsck clean."""
    assert git(repo, "worktree", "prune", "--dry-run", "-v").strip() == ""
    git(repo, "fsck", "--no-progress", "--no-dangling")


def branch_exists(repo: Path, branch: str) -> bool:
    return bool(git(repo, "branch", "--list", branch).strip())


def add_project(daemon: DaemonProcess, repo: Path, **extra: Any) -> dict[str, Any]:
    project: dict[str, Any] = daemon.call("project.add", {"path": str(repo), **extra})["project"]
    return project


def create(daemon: DaemonProcess, project_id: str, name: str, **extra: Any) -> dict[str, Any]:
    return daemon.call("workspace.create", {"project_id": project_id, "name": name, **extra})
