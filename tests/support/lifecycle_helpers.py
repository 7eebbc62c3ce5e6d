"""Shared helpers of the lifecycle tests: a daemon, a real repository, git's own view."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from xum_client.errors import XumRpcError

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import commit_config, git, make_repo


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


def kept_env_copy(daemon: DaemonProcess, base: Path) -> Path:
    """A workspace whose preserved `.env` ("KEY=1") was kept when it was removed with force:
    the kept copy's directory (ROOT/archive/<ws>; the file is at `files/.env`)."""
    repo = make_repo(
        base / "repo",
        {
            "README.md": "hi\n",
            ".gitignore": ".env\n",
            ".xum/config.toml": '[scripts]\npreserve = [".env"]\n',
        },
    )
    project = add_project(daemon, repo)
    ws = create(daemon, project["id"], "w")["workspace"]
    (Path(ws["path"]) / ".env").write_text("KEY=1\n")
    removed = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    return Path(removed["kept"]["path"])


def failing_teardown(ctl: Path, *, log_runs: bool = False) -> str:
    """A teardown command that fails ('still in use', exit 3) until the test creates `ctl/ok`;
    with `log_runs`, each run appends its working directory to `ctl/runs`."""
    log = f"echo $PWD >> {ctl}/runs; " if log_runs else ""
    return f"{log}if [ -f {ctl}/ok ]; then exit 0; fi; echo 'still in use' >&2; exit 3"


def commit_scripts(repo: Path, *, teardown: str, setup: list[str] | None = None) -> None:
    """Commit a `.xum/config.toml` with these scripts into `repo`."""
    import json

    lines = f"setup = {json.dumps(setup)}\n" if setup else ""
    lines += f"teardown = [{json.dumps(teardown)}]\n"
    commit_config(repo, f"[scripts]\n{lines}", "scripts")


@contextmanager
def trusted_daemon(
    root: Path, repo: Path, config: str
) -> Iterator[tuple[DaemonProcess, dict[str, Any]]]:
    """A daemon on `root` (with `config`) where `repo` is a project whose config is trusted."""
    write_config(root, config)
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        daemon.call("project.trust", {"project_id": project["id"]})
        yield daemon, project
    finally:
        daemon.close()
