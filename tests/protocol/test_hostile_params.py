"""Strings from params that reach an argv, an environment or a path: a NUL (or a control
character where it cannot belong) is a clear `invalid_params`/`invalid_name` error before
anything runs, never an internal error and never half-applied."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from xum_protocol.models.lease import AcquireParams
from xum_protocol.models.process import SpawnParams, WriteParams
from xum_protocol.models.project import ProjectAddParams

from tests.support.daemon import DaemonProcess, short_tmpdir
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import add_project, create, rpc_error, worktrees


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[DaemonProcess, Path, str, str]]:
    tmp = short_tmpdir("xump-")
    daemon = DaemonProcess(tmp / "root").start()
    repo = make_repo(tmp / "repo")
    project = add_project(daemon, repo)["id"]
    ws = create(daemon, project, "w")["workspace"]["id"]
    yield daemon, repo, project, ws
    daemon.close()


def _state(daemon: DaemonProcess, repo: Path) -> tuple[Any, ...]:
    names = sorted(w["name"] for w in daemon.call("workspace.list", {})["workspaces"])
    branches = git(repo, "for-each-ref", "--format=%(refname)", "refs/heads")
    procs = len(daemon.call("process.list", {})["processes"])
    projects = len(daemon.call("project.list", {})["projects"])
    return names, sorted(worktrees(repo)), branches, procs, projects


BRANCHES = ["x\0y", "x\x01y", "new\nline", "esc\x1b[31m", "del\x7f", "@{-1}", "-D", "HEAD"]
BASES = ["x\0y", "HEAD\nHEAD", "tab\tHEAD", "--upload-pack=touch /tmp/xum-pwned", "-h"]


@pytest.mark.parametrize("branch", BRANCHES)
def test_branch_with_nul_or_control_characters_is_invalid_name(
    world: tuple[DaemonProcess, Path, str, str], branch: str
) -> None:
    daemon, repo, project, _ = world
    before = _state(daemon, repo)
    error = rpc_error(
        daemon, "workspace.create", {"project_id": project, "name": "b", "branch": branch}
    )
    assert error.kind in {"invalid_name", "invalid_params"}, error
    assert _state(daemon, repo) == before


@pytest.mark.parametrize("base", BASES)
def test_base_with_nul_or_control_characters_is_refused(
    world: tuple[DaemonProcess, Path, str, str], base: str
) -> None:
    daemon, repo, project, _ = world
    before = _state(daemon, repo)
    error = rpc_error(
        daemon, "workspace.create", {"project_id": project, "name": "b", "base": base}
    )
    assert error.kind in {"invalid_name", "invalid_params", "not_found"}, error
    assert _state(daemon, repo) == before
    assert not Path("/tmp/xum-pwned").exists()


def test_turn_base_with_a_nul_is_refused(world: tuple[DaemonProcess, Path, str, str]) -> None:
    daemon, repo, _, ws = world
    before = _state(daemon, repo)
    params = {"owner_workspace_id": ws, "mode": "new", "base": "HEAD\0"}
    assert rpc_error(daemon, "turn.create", params).kind == "invalid_params"
    assert _state(daemon, repo) == before


@pytest.mark.parametrize(
    "extra",
    [
        {"argv": ["sh", "-c", "echo \0"]},
        {"argv": ["s\0h"]},
        {"argv": ["true"], "env": {"A": "x\0y"}},
        {"argv": ["true"], "env": {"A\0": "x"}},
        {"argv": ["true"], "env": {"A=B": "x"}},
        {"argv": ["true"], "env": {"": "x"}},
        {"argv": ["true"], "label": "a\0b"},
        {"argv": ["true"], "label": "line\nbreak"},
        {"argv": ["true"], "label": "esc\x1b[2J"},
    ],
)
def test_spawn_with_nul_in_argv_env_or_label_is_invalid_params(
    world: tuple[DaemonProcess, Path, str, str], extra: dict[str, Any]
) -> None:
    daemon, repo, _, ws = world
    before = _state(daemon, repo)
    error = rpc_error(daemon, "process.spawn", {"workspace_id": ws, "kind": "exec", **extra})
    assert error.kind == "invalid_params", error
    assert _state(daemon, repo) == before


def test_lease_label_with_control_characters_is_invalid_params(
    world: tuple[DaemonProcess, Path, str, str],
) -> None:
    daemon, _, _, ws = world
    params = {"workspace_id": ws, "kind": "editor", "pid": os.getpid(), "label": "x\x1b]0;y\x07"}
    assert rpc_error(daemon, "lease.acquire", params).kind == "invalid_params"


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("project.add", {"path": "/tmp\0/x"}),
        ("project.add", {"path": "/tmp", "workspaces_dir": "/tmp/\0x"}),
        ("project.get", {"project_id": "prj_\0"}),
        ("workspace.get", {"workspace_id": "ws_\0"}),
        ("workspace.list", {"project_id": "prj_\0"}),
        ("workspace.strays", {"project_id": "prj_\0"}),
        ("cleanup.retry", {"workspace_id": "ws_\0"}),
        ("process.get", {"process_id": "proc_\0"}),
        ("process.signal", {"process_id": "proc_0000000000000000", "signal": "TE\0RM"}),
        ("lease.release", {"lease_id": "lease_\0"}),
        ("turn.get", {"handle_id": "turn_\0"}),
        ("events.subscribe", {"types": ["workspace.\0"]}),
    ],
)
def test_nul_anywhere_else_is_invalid_params(
    world: tuple[DaemonProcess, Path, str, str], method: str, params: dict[str, Any]
) -> None:
    daemon, repo, _, _ = world
    before = _state(daemon, repo)
    error = rpc_error(daemon, method, params)
    assert error.kind == "invalid_params", error
    assert "NUL" in str(error) or "NUL" in repr(error.data), error
    assert _state(daemon, repo) == before


def test_protocol_models_refuse_nul_but_stdin_data_may_carry_it() -> None:
    with pytest.raises(ValidationError, match="NUL"):
        ProjectAddParams(path="/a\0b")
    with pytest.raises(ValidationError, match="NUL"):
        SpawnParams(workspace_id="ws_1", kind="exec", argv=["a", "b\0"])
    with pytest.raises(ValidationError, match="NUL"):
        SpawnParams(workspace_id="ws_1", kind="exec", argv=["a"], env={"K\0": "v"})
    with pytest.raises(ValidationError):
        AcquireParams(workspace_id="ws_1", kind="editor", pid=1, label="a\nb")
    # Bytes for a process's stdin or terminal are data, not a name: NUL is a valid byte there.
    assert WriteParams(process_id="proc_1", data="\0\x03").data == "\0\x03"
    # Ordinary text with spaces and non-ASCII stays valid.
    assert AcquireParams(workspace_id="ws_1", kind="editor", pid=1, label="vim é").label
