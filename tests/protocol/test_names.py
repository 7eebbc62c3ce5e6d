"""Every bad project or workspace name is `invalid_name` (-32004), whichever rule it breaks:
NUL, over the length cap (even megabytes long), empty, a slash, `..`, a leading dot or dash,
control characters. Never `invalid_params`, never a default silently taken for an empty name;
nothing is changed; the answer does not echo a huge name back."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, short_tmpdir
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import add_project, create, rpc_error, worktrees

BAD_NAMES = [
    "a\0b",
    "\0",
    "x" * 65,
    "x" * 257,
    "x" * 1_000_000,
    "",
    "a/b",
    "..",
    "a..b",
    "-rf",
    ".hidden",
    "new\nline",
    "esc\x1b[31m",
    "é",
]


@pytest.fixture(scope="module")
def world() -> Iterator[dict[str, Any]]:
    tmp = short_tmpdir("xumn-")
    daemon = DaemonProcess(tmp / "root").start()
    try:
        repo = make_repo(tmp / "repo")
        other = make_repo(tmp / "other")
        project = add_project(daemon, repo)["id"]
        ws = create(daemon, project, "w")["workspace"]["id"]
        yield {"daemon": daemon, "repo": repo, "other": other, "project": project, "ws": ws}
    finally:
        daemon.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _state(daemon: DaemonProcess, repo: Path, owner: str) -> tuple[Any, ...]:
    return (
        sorted(w["name"] for w in daemon.call("workspace.list", {})["workspaces"]),
        sorted(p["name"] for p in daemon.call("project.list", {})["projects"]),
        len(daemon.call("turn.list", {"owner_workspace_id": owner})["turns"]),
        sorted(worktrees(repo)),
        git(repo, "for-each-ref", "--format=%(refname)", "refs/heads"),
    )


@pytest.mark.parametrize("name", BAD_NAMES, ids=lambda n: repr(n)[:20])
@pytest.mark.parametrize(
    "method", ["project.add", "workspace.create", "workspace.rename", "turn.create"]
)
def test_every_bad_name_is_invalid_name(world: dict[str, Any], method: str, name: str) -> None:
    daemon: DaemonProcess = world["daemon"]
    params: dict[str, Any] = {
        "project.add": {"path": str(world["other"]), "name": name},
        "workspace.create": {"project_id": world["project"], "name": name},
        "workspace.rename": {"workspace_id": world["ws"], "name": name},
        "turn.create": {"owner_workspace_id": world["ws"], "mode": "new", "name": name},
    }[method]
    before = _state(daemon, world["repo"], world["ws"])
    error = rpc_error(daemon, method, params)
    assert error.kind == "invalid_name", error
    assert error.code == -32004, error
    assert len(str(error)) < 1000 and len(repr(error.data)) < 1000
    assert _state(daemon, world["repo"], world["ws"]) == before
