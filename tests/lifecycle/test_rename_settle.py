"""A rename whose undo cannot put things back keeps its journal and flags the workspace.

1. `workspace.keep` settles that journal without a restart, with recovery's own logic for the
   row: forward or back by what the disk shows; when the disk proves neither state, an
   `invalid_state` naming why, and the journal and the flag stay.
2. The undo's move back takes the directory exclusion of the old path: it waits for another
   operation on that directory (here a create held in a git hook), then revalidates.

A real daemon and real git; the rename is held at `workspace.rename.hold` (tests/support/holds.py)
and made to fail by a ref `xum/b/x` that blocks `git branch -m xum/a xum/b`.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lifecycle.test_rename_undo_races import in_thread, journals
from tests.support.daemon import DaemonProcess, short_tmpdir
from tests.support.gitrepo import git, make_repo
from tests.support.holds import hold_env, release, wait_held
from tests.support.lifecycle_helpers import (
    add_project,
    branch_exists,
    create,
    rpc_error,
    worktrees,
)
from tests.support.wait import until

POINT = "workspace.rename.hold"


@pytest.fixture
def base() -> Iterator[Path]:
    path = short_tmpdir("xums-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start(base: Path) -> tuple[DaemonProcess, Path]:
    daemon = DaemonProcess(base / "root", env=hold_env(POINT, base / "holds")).start()
    return daemon, make_repo(base / "repo")


def failed_rename(daemon: DaemonProcess, repo: Path, base: Path) -> tuple[dict[str, Any], Path]:
    """Rename a -> b; while it is held, a file takes the old path, so its undo cannot move the
    checkout back: the journal is kept and the row flagged. Returns the workspace and new path."""
    project = add_project(daemon, repo)
    ws = create(daemon, project["id"], "a")["workspace"]
    old, new = Path(ws["path"]), Path(ws["path"]).parent / "b"
    (old / "work.txt").write_text("work\n")
    git(repo, "branch", "xum/b/x")
    thread, out = in_thread(
        lambda: daemon.call("workspace.rename", {"workspace_id": ws["id"], "name": "b"})
    )
    wait_held(POINT, base / "holds")
    old.write_text("someone else's file\n")
    release(POINT, base / "holds")
    thread.join(30)
    assert "error" in out, out
    assert journals(daemon.root) == [("a", "b")]
    got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert got["interrupted"] is True and "workspace.keep" in got["interrupted_reason"], got
    return ws, new


def get(daemon: DaemonProcess, workspace_id: str) -> dict[str, Any]:
    workspace: dict[str, Any] = daemon.call("workspace.get", {"workspace_id": workspace_id})[
        "workspace"
    ]
    return workspace


def keep(daemon: DaemonProcess, workspace_id: str) -> dict[str, Any]:
    workspace: dict[str, Any] = daemon.call("workspace.keep", {"workspace_id": workspace_id})[
        "workspace"
    ]
    return workspace


def test_keep_settles_a_kept_rename_journal_forward(base: Path) -> None:
    daemon, repo = start(base)
    try:
        pid = daemon.pid
        ws, new = failed_rename(daemon, repo, base)
        old = Path(ws["path"])
        reason = get(daemon, ws["id"])["interrupted_reason"]

        # Both paths exist: neither state is provable. Refused, and nothing changes.
        err = rpc_error(daemon, "workspace.keep", {"workspace_id": ws["id"]})
        assert err.kind == "invalid_state", err
        assert "neither state" in err.message and str(old) in err.message, err.message
        assert journals(daemon.root) == [("a", "b")]
        got = get(daemon, ws["id"])
        assert got["interrupted"] is True and got["interrupted_reason"] == reason, got
        assert got["name"] == "a" and got["path"] == str(old), got

        # The old path is free again: only the new state is on disk, so keep rolls forward.
        # git still refuses the branch rename (xum/b/x): the row keeps xum/a, flagged saying so.
        old.unlink()
        got = keep(daemon, ws["id"])
        assert journals(daemon.root) == []
        assert (got["name"], got["path"], got["branch"]) == ("b", str(new), "xum/a"), got
        assert got["interrupted"] is True and "could not" in got["interrupted_reason"], got
        assert worktrees(repo)[str(new)]["branch"] == "refs/heads/xum/a"
        assert (new / "work.txt").read_text() == "work\n"

        # No journal left: an ordinary keep clears the flag.
        got = keep(daemon, ws["id"])
        assert got["interrupted"] is False and got["name"] == "b", got
        assert daemon.pid == pid, "settled by a restart, not by keep"
    finally:
        daemon.close()


def test_keep_settles_a_kept_rename_journal_back(base: Path) -> None:
    daemon, repo = start(base)
    try:
        ws, new = failed_rename(daemon, repo, base)
        old = Path(ws["path"])
        # The user frees the old path and moves the checkout back by hand.
        old.unlink()
        git(repo, "worktree", "move", "-f", "-f", str(new), str(old))
        got = keep(daemon, ws["id"])
        assert journals(daemon.root) == []
        assert (got["name"], got["path"], got["branch"]) == ("a", str(old), "xum/a"), got
        assert got["interrupted"] is False, got
        assert branch_exists(repo, "xum/a") and not new.exists()
        assert (old / "work.txt").read_text() == "work\n"
    finally:
        daemon.close()


def undo_waits(daemon: DaemonProcess, workspace_id: str) -> bool:
    return any(
        "coordinator.directory_waiting" in line and f"rename undo {workspace_id}" in line
        for line in daemon.log_text().splitlines()
    )


def test_the_undo_waits_for_the_old_paths_directory(base: Path) -> None:
    """A second project shares the workspaces directory; while the rename is held, its create
    of `a` takes the freed old path's directory exclusion and is held there (a post-checkout
    hook waits). The undo must wait for that exclusion, then revalidate: the path is taken, so
    the checkout stays at the new path, the journal is kept and nothing is moved into the other
    checkout. Without the exclusion the undo raced the create."""
    daemon, repo = start(base)
    other_repo, ctl, shared = make_repo(base / "repo2"), base / "ctl", base / "ws"
    ctl.mkdir()
    hook = other_repo / ".git" / "hooks" / "post-checkout"
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text(f"#!/bin/sh\ntouch {ctl}/started\nuntil [ -f {ctl}/ok ]; do sleep 0.05; done\n")
    hook.chmod(0o755)
    try:
        project = add_project(daemon, repo, workspaces_dir=str(shared))
        other_project = add_project(daemon, other_repo, workspaces_dir=str(shared))
        ws = create(daemon, project["id"], "a")["workspace"]
        old, new = Path(ws["path"]), shared / "b"
        (old / "work.txt").write_text("work\n")
        git(repo, "branch", "xum/b/x")
        thread, out = in_thread(
            lambda: daemon.call("workspace.rename", {"workspace_id": ws["id"], "name": "b"})
        )
        wait_held(POINT, base / "holds")
        creating, created = in_thread(lambda: create(daemon, other_project["id"], "a"))
        until((ctl / "started").exists, message="the other create holds the old path")
        release(POINT, base / "holds")
        until(lambda: undo_waits(daemon, ws["id"]), message="the undo waits for the old path")
        assert thread.is_alive(), out
        (ctl / "ok").touch()
        creating.join(30)
        thread.join(30)
        assert "result" in created, created
        assert created["result"]["workspace"]["path"] == str(old)
        assert "error" in out and out["error"].kind != "internal", out
        assert journals(daemon.root) == [("a", "b")]
        got = get(daemon, ws["id"])
        assert got["interrupted"] is True and f"{old} is taken" in got["interrupted_reason"], got
        assert (new / "work.txt").read_text() == "work\n"  # never moved into the other one
        assert not (old / "work.txt").exists()
        assert worktrees(other_repo)[str(old)]["branch"] == "refs/heads/xum/a"
    finally:
        daemon.close()
