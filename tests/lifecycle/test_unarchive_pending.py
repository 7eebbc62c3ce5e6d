"""Unarchive over the old checkout's pending cleanup (worktree runtime, real teardown scripts).

The archive's teardown fails (a trusted `.xum/config.toml` whose script looks at flag files), so
its obligations stay pending; the retry backoff is long, so only what unarchive itself does can
settle them during a test. Unarchive runs them first (forced), then creates the new incarnation;
every later retry of the old obligations leaves the live checkout alone.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import (
    assert_git_healthy,
    commit_scripts,
    create,
    failing_teardown,
    rpc_error,
    trusted_daemon,
    worktrees,
)
from tests.support.wait import until

# Nothing is retried by the background service within a test: only unarchive settles things.
SLOW_RETRY = "[cleanup]\nbackoff_initial_s = 120\nbackoff_max_s = 240\nbackoff_jitter = 0\n"
CLOSED = ("completed", "abandoned")


@pytest.fixture
def repo(tmp_short: Path, ctl: Path) -> Path:
    repo = make_repo(tmp_short / "repo", {"README.md": "hi\n", "src/a.txt": "a1\n"})
    commit_scripts(repo, teardown=failing_teardown(ctl, log_runs=True))
    return repo


@pytest.fixture
def started(root: Path, repo: Path) -> Iterator[tuple[DaemonProcess, dict[str, Any]]]:
    with trusted_daemon(root, repo, SLOW_RETRY) as running:
        yield running


def obligations(daemon: DaemonProcess, wid: str) -> dict[str, dict[str, Any]]:
    listed = daemon.call("cleanup.list", {"workspace_id": wid})["obligations"]
    return {o["kind"]: o for o in listed}


def archived_with_pending_teardown(
    daemon: DaemonProcess, project: dict[str, Any], name: str
) -> dict[str, Any]:
    """An archived workspace with uncommitted work in its snapshot and its teardown pending."""
    ws = create(daemon, project["id"], name)["workspace"]
    path = Path(ws["path"])
    (path / "src" / "a.txt").write_text("a2 staged\n")
    git(path, "add", "src/a.txt")
    (path / "src" / "a.txt").write_text("a3 unstaged\n")
    (path / "notes.txt").write_text("untracked work\n")
    result = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert result["cleanup"]["status"] == "pending", result["cleanup"]
    assert result["snapshot"] is not None
    assert path.is_dir(), "the checkout waits for its teardown"
    return ws


def assert_work_restored(path: Path) -> None:
    assert (path / "src" / "a.txt").read_text() == "a3 unstaged\n"
    assert git(path, "show", ":src/a.txt") == "a2 staged\n"
    assert (path / "notes.txt").read_text() == "untracked work\n"
    status = git(path, "status", "--porcelain=v1").splitlines()
    assert {"MM src/a.txt", "?? notes.txt"} <= set(status), status


def retry_until_closed(daemon: DaemonProcess, wid: str, old_incarnation: str) -> None:
    """Retry the old obligations (reclaim included) until none is pending."""

    def closed() -> bool:
        daemon.call("cleanup.retry", {"workspace_id": wid})
        obs = [o for o in obligations(daemon, wid).values() if o["incarnation"] == old_incarnation]
        return bool(obs) and all(o["state"] in CLOSED for o in obs)

    until(closed, message="the old incarnation's obligations to close")


def test_unarchive_runs_the_pending_teardown_then_recreates_the_checkout(
    started: tuple[DaemonProcess, dict[str, Any]], repo: Path, ctl: Path
) -> None:
    daemon, project = started
    ws = archived_with_pending_teardown(daemon, project, "one")
    path = Path(ws["path"])
    (ctl / "ok").touch()  # the teardown would pass now; its retry is two minutes away

    restored = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})["workspace"]

    assert restored["state"] == "active" and restored["incarnation"] != ws["incarnation"]
    assert worktrees(repo)[str(path)]["locked"] == f"xum {ws['id']} {restored['incarnation']}"
    assert_work_restored(path)
    (path / "after.txt").write_text("new work in the live checkout\n")
    retry_until_closed(daemon, ws["id"], ws["incarnation"])
    obs = obligations(daemon, ws["id"])
    assert obs["teardown"]["state"] == "completed" and obs["trash"]["state"] == "completed"
    # At archive (failed) and at unarchive (passed, in the old checkout): never in the new one.
    assert (ctl / "runs").read_text().split() == [str(path)] * 2
    assert (path / "after.txt").read_text() == "new work in the live checkout\n"
    assert_work_restored(path)
    assert list((daemon.root / "trash").iterdir()) == []
    got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert got["state"] == "active" and got["incarnation"] == restored["incarnation"]
    assert_git_healthy(repo)


def test_unarchive_over_a_checkout_moved_away_drops_the_stale_locked_entry(
    started: tuple[DaemonProcess, dict[str, Any]], repo: Path, ctl: Path, tmp_short: Path
) -> None:
    daemon, project = started
    ws = archived_with_pending_teardown(daemon, project, "two")
    path = Path(ws["path"])
    # The old checkout is moved away by hand: git still has it registered, locked, "missing".
    moved = tmp_short / "old-checkout"
    shutil.move(str(path), str(moved))
    assert worktrees(repo)[str(path)]["locked"] == f"xum {ws['id']} {ws['incarnation']}"

    restored = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})["workspace"]

    assert restored["state"] == "active"
    assert worktrees(repo)[str(path)]["locked"] == f"xum {ws['id']} {restored['incarnation']}"
    assert_work_restored(path)
    (ctl / "ok").touch()  # a later teardown would run, if anything still tried
    retry_until_closed(daemon, ws["id"], ws["incarnation"])
    obs = obligations(daemon, ws["id"])
    assert obs["teardown"]["state"] == "abandoned"
    assert (ctl / "runs").read_text().split() == [str(path)], "teardown ran at archive only"
    assert_work_restored(path)
    assert (moved / "notes.txt").read_text() == "untracked work\n", "moved-away copy untouched"
    assert_git_healthy(repo)


def test_unarchive_while_the_teardown_still_fails_is_cleanup_pending(
    started: tuple[DaemonProcess, dict[str, Any]], ctl: Path
) -> None:
    daemon, project = started
    ws = archived_with_pending_teardown(daemon, project, "three")
    path = Path(ws["path"])
    err = rpc_error(daemon, "workspace.unarchive", {"workspace_id": ws["id"]})
    assert err.kind == "cleanup_pending"
    assert "still in use" in err.message
    assert obligations(daemon, ws["id"])["teardown"]["attempts"] == 2, "retried by unarchive"
    got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert got["state"] == "archived" and got["incarnation"] == ws["incarnation"]
    assert (path / "notes.txt").read_text() == "untracked work\n"


def test_unarchive_never_trashes_work_made_after_the_archive(
    started: tuple[DaemonProcess, dict[str, Any]], ctl: Path
) -> None:
    daemon, project = started
    ws = archived_with_pending_teardown(daemon, project, "four")
    path = Path(ws["path"])
    (path / "late.txt").write_text("written after the archive\n")
    (ctl / "ok").touch()
    err = rpc_error(daemon, "workspace.unarchive", {"workspace_id": ws["id"]})
    assert err.kind == "not_safe"
    assert "late.txt" in err.message
    assert (path / "late.txt").read_text() == "written after the archive\n"
    assert obligations(daemon, ws["id"])["teardown"]["attempts"] == 1, "nothing ran"
    got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert got["state"] == "archived"


def test_directory_unarchive_never_trashes_work_made_after_the_archive(
    started: tuple[DaemonProcess, dict[str, Any]], ctl: Path
) -> None:
    """The directory runtime has no snapshot commit: the lingering checkout is compared with
    the archive store's copy. New or changed files are `not_safe`, naming them; files the
    archive holds (or that were deleted since) are not work to lose."""
    daemon, project = started
    ws = create(daemon, project["id"], "dir", runtime="directory")["workspace"]
    path = Path(ws["path"])
    (path / "kept.txt").write_text("archived content\n")
    (path / "sub").mkdir()
    (path / "sub" / "edit.txt").write_text("before\n")
    (path / "gone.txt").write_text("deleted after the archive\n")
    archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert archived["cleanup"]["status"] == "pending", archived["cleanup"]
    assert path.is_dir(), "the checkout waits for its teardown"
    (ctl / "ok").touch()
    (path / "late.txt").write_text("written after the archive\n")
    (path / "sub" / "edit.txt").write_text("after!\n")
    (path / "gone.txt").unlink()

    err = rpc_error(daemon, "workspace.unarchive", {"workspace_id": ws["id"]})
    assert err.kind == "not_safe", err
    assert "late.txt" in err.message and "sub/edit.txt" in err.message, err.message
    assert sorted(err.data["files"]) == ["late.txt", "sub/edit.txt"]
    assert "kept.txt" not in err.message and "gone.txt" not in err.message
    assert (path / "late.txt").read_text() == "written after the archive\n"
    assert (path / "sub" / "edit.txt").read_text() == "after!\n"
    assert obligations(daemon, ws["id"])["teardown"]["attempts"] == 1, "nothing ran"
    got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert got["state"] == "archived" and got["incarnation"] == ws["incarnation"]

    # Moved away by the user: the rest is what the archive holds, so unarchive proceeds.
    (path / "late.txt").unlink()
    (path / "sub" / "edit.txt").write_text("before\n")
    restored = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})["workspace"]
    assert restored["state"] == "active"
    assert (path / "kept.txt").read_text() == "archived content\n"
    assert (path / "gone.txt").read_text() == "deleted after the archive\n"
    assert not (path / "late.txt").exists()
