"""Work made in a lingering archived checkout is never trashed (both runtimes, a real daemon).

The archive's teardown fails (a trusted script steered by a flag file), so the checkout lingers
with its cleanup pending. The user then edits files in it. When the cleanup is retried (the
teardown passes now), its trash step compares the checkout with the archive, exactly as unarchive
does, and leaves the checkout in place, pending, naming the files and the way out. Moving the new
work away is the way out: the next retry trashes the checkout and unarchive restores the archive.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import (
    commit_scripts,
    create,
    failing_teardown,
    rpc_error,
    trusted_daemon,
)
from tests.support.wait import until

# The background service does not retry within a test: each retry here is the test's own.
SLOW_RETRY = "[cleanup]\nbackoff_initial_s = 120\nbackoff_max_s = 240\nbackoff_jitter = 0\n"
# The background service retries at once: what it does on its own is what is asserted.
FAST_RETRY = "[cleanup]\nbackoff_initial_s = 0.05\nbackoff_max_s = 0.2\nbackoff_jitter = 0\n"


@pytest.fixture
def repo(tmp_short: Path, ctl: Path) -> Path:
    repo = make_repo(tmp_short / "repo", {"README.md": "hi\n"})
    commit_scripts(repo, teardown=failing_teardown(ctl))
    return repo


def obligations(daemon: DaemonProcess, wid: str) -> dict[str, dict[str, Any]]:
    listed = daemon.call("cleanup.list", {"workspace_id": wid})["obligations"]
    return {o["kind"]: o for o in listed}


def archive_then_edit(
    daemon: DaemonProcess, project: dict[str, Any], runtime: str
) -> tuple[dict[str, Any], Path]:
    """An archived workspace whose checkout lingers (teardown failed) and gained work since."""
    ws = create(daemon, project["id"], f"w-{runtime}", runtime=runtime)["workspace"]
    path = Path(ws["path"])
    (path / "kept.txt").write_text("archived\n")
    result = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert result["cleanup"]["status"] == "pending", result["cleanup"]
    assert path.is_dir(), "the checkout waits for its teardown"
    (path / "kept.txt").write_text("changed after the archive\n")
    (path / "new.txt").write_text("made after the archive\n")
    return ws, path


def assert_left_in_place(daemon: DaemonProcess, ws: dict[str, Any], path: Path) -> None:
    obs = obligations(daemon, ws["id"])
    assert obs["teardown"]["state"] == "completed", obs["teardown"]
    trash = obs["trash"]
    assert trash["state"] == "pending", trash
    error = trash["last_error"] or ""
    assert "new.txt" in error and "kept.txt" in error, error
    assert "cleanup.retry" in error and "workspace.remove" in error, error
    assert (path / "kept.txt").read_text() == "changed after the archive\n"
    assert (path / "new.txt").read_text() == "made after the archive\n"
    trash_dir = daemon.root / "trash"
    assert not trash_dir.exists() or list(trash_dir.iterdir()) == []


@pytest.mark.parametrize("runtime", ["worktree", "directory"])
def test_retry_leaves_an_archived_checkout_with_new_work_then_the_way_out_works(
    root: Path, repo: Path, ctl: Path, tmp_short: Path, runtime: str
) -> None:
    with trusted_daemon(root, repo, SLOW_RETRY) as (daemon, project):
        ws, path = archive_then_edit(daemon, project, runtime)
        (ctl / "ok").touch()  # the teardown passes now: only the new work holds the trash step

        daemon.call("cleanup.retry", {"workspace_id": ws["id"]})

        assert_left_in_place(daemon, ws, path)
        assert daemon.call("cleanup.list", {})["pending"] >= 1
        # Unarchive refuses too (the same comparison), naming the same files.
        refused = rpc_error(daemon, "workspace.unarchive", {"workspace_id": ws["id"]})
        assert refused.kind == "not_safe", refused
        assert_left_in_place(daemon, ws, path)

        # The way out: move the new work away; the next retry trashes the checkout.
        aside = tmp_short / "aside"
        aside.mkdir()
        shutil.move(str(path / "new.txt"), str(aside / "new.txt"))
        shutil.move(str(path / "kept.txt"), str(aside / "kept.txt"))
        (path / "kept.txt").write_text("archived\n")
        daemon.call("cleanup.retry", {"workspace_id": ws["id"]})

        def trashed() -> bool:
            obs = obligations(daemon, ws["id"])
            return obs["trash"]["state"] == "completed" and obs["reclaim"]["state"] == "completed"

        until(trashed, message="the trash and reclaim steps to complete")
        assert not path.exists()
        restored = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})["workspace"]
        assert restored["state"] == "active"
        assert (path / "kept.txt").read_text() == "archived\n"
        assert (aside / "new.txt").read_text() == "made after the archive\n"


@pytest.mark.parametrize("runtime", ["worktree", "directory"])
def test_background_retry_never_trashes_new_work_in_an_archived_checkout(
    root: Path, repo: Path, ctl: Path, runtime: str
) -> None:
    with trusted_daemon(root, repo, FAST_RETRY) as (daemon, project):
        ws, path = archive_then_edit(daemon, project, runtime)
        (ctl / "ok").touch()

        def trash_tried() -> bool:
            obs = obligations(daemon, ws["id"])
            # Or no longer pending: without the check the trash step completes at once.
            trash = obs["trash"]
            return trash["state"] != "pending" or (
                obs["teardown"]["state"] == "completed" and trash["attempts"] >= 2
            )

        until(trash_tried, message="the background service to try the trash step twice")
        assert_left_in_place(daemon, ws, path)


def test_remove_of_the_archived_workspace_discards_the_lingering_work(
    root: Path, repo: Path, ctl: Path
) -> None:
    # The explicit way to discard: remove with force is the user's decision, so its trash is
    # not held; without force it refuses `not_safe` naming the files.
    with trusted_daemon(root, repo, SLOW_RETRY) as (daemon, project):
        ws, path = archive_then_edit(daemon, project, "worktree")
        (ctl / "ok").touch()
        daemon.call("cleanup.retry", {"workspace_id": ws["id"]})
        assert_left_in_place(daemon, ws, path)

        # Without force, remove refuses as it does for an active workspace's unsaved work.
        refused = rpc_error(daemon, "workspace.remove", {"workspace_id": ws["id"]})
        assert refused.kind == "not_safe", refused
        assert "new.txt" in str(refused) and "kept.txt" in str(refused), refused
        assert daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]["state"] == (
            "archived"
        )
        assert_left_in_place(daemon, ws, path)

        daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
        daemon.call("cleanup.retry", {"workspace_id": ws["id"]})

        until(lambda: not path.exists(), message="the lingering checkout to be trashed")


async def test_a_check_that_cannot_tell_leaves_the_checkout_in_place(tmp_short: Path) -> None:
    # Fail closed: when the comparison itself fails (a fault: git cannot read the checkout),
    # the trash step does not move the checkout; it stays pending with the error named.
    import secrets

    from xumd.cleanup.obligations import ObligationRow

    from tests.cleanup.test_support import add_workspace, make_dir_checkout, make_world, ws_id

    seen: list[str] = []

    class CannotTell:
        async def unsaved_files(self, ob: ObligationRow) -> list[str]:
            seen.append(ob.kind)
            raise OSError(5, "Input/output error", ob.path)

    world = make_world(tmp_short / "unit", None, unsaved=CannotTell())
    wid, inc = ws_id("f"), secrets.token_hex(8)
    path = world.root / "workspaces" / "f"
    ident = make_dir_checkout(path, wid, inc)
    add_workspace(world.app, world.project_id, wid, path, inc, "archived")
    world.plan(wid, path, inc, ident, teardown=False)

    status = await world.service.run_workspace(wid, force=True)

    assert seen == ["trash"]
    assert status.status == "pending", status
    assert status.last_error is not None and "Input/output error" in status.last_error
    assert path.is_dir() and world.states(wid)["trash"] == "pending"
