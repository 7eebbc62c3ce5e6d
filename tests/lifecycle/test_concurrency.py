"""Races against a real daemon: parallel creates, concurrent removes, archive vs remove."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from xum_client.errors import XumRpcError

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import git
from tests.support.lifecycle_helpers import (
    assert_git_healthy,
    branch_exists,
    create,
    worktrees,
)


def race(calls: list[Callable[[], dict[str, Any]]]) -> list[dict[str, Any] | XumRpcError]:
    """Run every call at once (each on its own connection); results or errors, in order."""

    def run(fn: Callable[[], dict[str, Any]]) -> dict[str, Any] | XumRpcError:
        try:
            return fn()
        except XumRpcError as exc:
            return exc

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_eight_parallel_creates_on_one_repo(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    names = [f"par-{i}" for i in range(8)]
    results = race([lambda n=n: create(daemon, project["id"], n) for n in names])  # type: ignore[misc]
    errors = [r for r in results if isinstance(r, XumRpcError)]
    assert not errors, [str(e) for e in errors]
    paths = {r["workspace"]["path"] for r in results if isinstance(r, dict)}
    assert len(paths) == 8
    listed = worktrees(repo)
    for result in results:
        assert isinstance(result, dict)
        ws = result["workspace"]
        assert ws["state"] == "active"
        assert listed[ws["path"]]["locked"] == f"xum {ws['id']} {ws['incarnation']}"
    assert all(branch_exists(repo, f"xum/{n}") for n in names)
    assert_git_healthy(repo)


def test_four_concurrent_removes_exactly_one_succeeds(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "victim")["workspace"]
    params = {"workspace_id": ws["id"]}
    results = race([lambda: daemon.call("workspace.remove", params)] * 4)
    ok = [r for r in results if isinstance(r, dict)]
    errors = [r for r in results if isinstance(r, XumRpcError)]
    assert len(ok) == 1, results
    assert ok[0]["removed"] is True
    assert {e.kind for e in errors} <= {"busy", "not_found"}
    assert not Path(ws["path"]).exists()
    assert branch_exists(repo, "xum/victim")
    assert_git_healthy(repo)


def _slow_teardown(daemon: DaemonProcess, repo: Path, project: dict[str, Any]) -> None:
    """A trusted teardown that takes a while keeps the structural reservation held."""
    (repo / ".xum").mkdir()
    (repo / ".xum" / "config.toml").write_text('[scripts]\nteardown = ["sleep 1"]\n')
    git(repo, "add", ".xum")
    git(repo, "commit", "-q", "-m", "slow teardown")
    daemon.call("project.trust", {"project_id": project["id"]})


def test_archive_racing_remove_never_both_succeed(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    _slow_teardown(daemon, repo, project)
    for round_ in range(3):
        ws = create(daemon, project["id"], f"r{round_}")["workspace"]
        params = {"workspace_id": ws["id"]}
        results = race(
            [
                lambda p=params: daemon.call("workspace.archive", p),  # type: ignore[misc]
                lambda p=params: daemon.call("workspace.remove", p),  # type: ignore[misc]
            ]
        )
        ok = [r for r in results if isinstance(r, dict)]
        assert len(ok) == 1, results
        loser = next(r for r in results if isinstance(r, XumRpcError))
        assert loser.kind in ("busy", "not_found", "invalid_state")
    assert_git_healthy(repo)


def test_removed_between_validation_and_action_is_not_found(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    _slow_teardown(daemon, repo, project)
    ws = create(daemon, project["id"], "gone")["workspace"]
    params = {"workspace_id": ws["id"]}
    # The client validated it (it exists, it is active) ...
    assert daemon.call("workspace.get", params)["workspace"]["state"] == "active"
    daemon.call("workspace.remove", params)
    # ... then every action on it must say not_found, never a successful no-op.
    for method in ("workspace.archive", "workspace.remove", "workspace.rename", "workspace.keep"):
        extra = {"name": "x"} if method == "workspace.rename" else {}
        results = race([lambda m=method, e=extra: daemon.call(m, {**params, **e})])  # type: ignore[misc]
        assert isinstance(results[0], XumRpcError)
        assert results[0].kind == "not_found", method
