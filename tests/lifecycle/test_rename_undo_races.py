"""Audit: a rename whose undo cannot move the checkout back, and a rename racing a create.

1. A rename fails after its checkout moved (the branch `xum/b` is blocked by a ref `xum/b/x`)
   and, meanwhile, something took the old path: the undo cannot move the checkout back. The
   journal must stay (and the row be flagged), so that a restart can still settle it; dropping
   it left a row naming the old path while the checkout sat at the new one.
2. A rename and a create of the same name: whichever commits its row second meets
   UNIQUE(project_id, name), which must be answered `conflict` naming the name, not `internal`.

Order is made deterministic with held fault points (xumd.base.faults.FaultPoint.hold).
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from xum_client.errors import XumRpcError

from tests.support.daemon import DaemonProcess, short_tmpdir
from tests.support.gitrepo import git, make_repo
from tests.support.holds import hold_env, release, wait_held
from tests.support.lifecycle_helpers import add_project, branch_exists, create, rpc_error, worktrees


@pytest.fixture
def base() -> Iterator[Path]:
    path = short_tmpdir("xumr-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start(base: Path, point: str) -> tuple[DaemonProcess, Path, Path]:
    holds = base / "holds"
    daemon = DaemonProcess(base / "root", env=hold_env(point, holds)).start()
    return daemon, make_repo(base / "repo"), holds


def in_thread(call: Callable[[], dict[str, Any]]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = call()
        except XumRpcError as exc:
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def journals(root: Path) -> list[tuple[str, str]]:
    db = sqlite3.connect(root / "state.db")
    try:
        return list(db.execute("SELECT from_name, to_name FROM rename_journal"))
    finally:
        db.close()


def test_a_rename_whose_undo_cannot_move_back_keeps_its_journal(base: Path) -> None:
    point = "workspace.rename.hold"
    daemon, repo, holds = start(base, point)
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "a")["workspace"]
        old, new = Path(ws["path"]), Path(ws["path"]).parent / "b"
        (old / "work.txt").write_text("work\n")
        git(repo, "branch", "xum/b/x")  # `git branch -m xum/a xum/b` will fail after the move
        thread, out = in_thread(
            lambda: daemon.call("workspace.rename", {"workspace_id": ws["id"], "name": "b"})
        )
        wait_held(point, holds)
        assert (new / "work.txt").exists() and not old.exists()
        old.write_text("someone else's file\n")  # the undo cannot move the checkout back
        release(point, holds)
        thread.join(30)
        assert "error" in out, out
        assert out["error"].kind != "internal", out["error"]

        assert journals(daemon.root) == [("a", "b")], "the journal was dropped"
        got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
        assert got["interrupted"] is True and "undo" in got["interrupted_reason"], got
        assert (new / "work.txt").read_text() == "work\n"
        assert old.read_text() == "someone else's file\n"  # never moved into or over
        again = rpc_error(daemon, "workspace.rename", {"workspace_id": ws["id"], "name": "c"})
        assert again.kind == "invalid_state" and "restart" in again.message

        # The user clears the way; the restart's recovery settles the journal (forward: only
        # the new path is ours).
        old.unlink()
        git(repo, "branch", "-D", "xum/b/x")
        daemon.restart()
        assert journals(daemon.root) == []
        got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
        assert got["name"] == "b" and got["path"] == str(new), got
        assert got["branch"] == "xum/b" and branch_exists(repo, "xum/b"), got
        assert worktrees(repo)[str(new)]["branch"] == "refs/heads/xum/b"
        assert (new / "work.txt").read_text() == "work\n"
    finally:
        daemon.close()


def test_a_rename_losing_its_name_to_a_create_is_a_conflict(base: Path) -> None:
    point = "workspace.rename.hold"
    daemon, repo, holds = start(base, point)
    try:
        project = add_project(daemon, repo)
        # Archived with a custom branch: the rename moves nothing, so the create can finish.
        ws = create(daemon, project["id"], "a", branch="feature/a")["workspace"]
        daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        thread, out = in_thread(
            lambda: daemon.call("workspace.rename", {"workspace_id": ws["id"], "name": "b"})
        )
        wait_held(point, holds)
        other = create(daemon, project["id"], "b")["workspace"]
        release(point, holds)
        thread.join(30)
        assert "error" in out, out
        err = out["error"]
        assert err.kind == "conflict", err
        assert "'b'" in err.message and other["id"] in err.message, err.message
        assert journals(daemon.root) == []
        got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
        assert (got["name"], got["state"], got["interrupted"]) == ("a", "archived", False)
        kept = daemon.call("workspace.get", {"workspace_id": other["id"]})["workspace"]
        assert (kept["name"], kept["state"]) == ("b", "active")
    finally:
        daemon.close()


def test_a_create_losing_its_name_to_a_rename_is_a_conflict(base: Path) -> None:
    point = "workspace.create.hold"
    daemon, repo, holds = start(base, point)
    try:
        project = add_project(daemon, repo)
        release(point, holds)  # let this first create through at once
        ws = create(daemon, project["id"], "a", runtime="directory")
        daemon.call("workspace.archive", {"workspace_id": ws["workspace"]["id"]})
        thread, out = in_thread(lambda: create(daemon, project["id"], "b"))
        wait_held(point, holds)
        renamed = daemon.call(
            "workspace.rename", {"workspace_id": ws["workspace"]["id"], "name": "b"}
        )["workspace"]
        release(point, holds)
        thread.join(30)
        assert "error" in out, out
        assert out["error"].kind == "conflict" and "'b'" in out["error"].message, out["error"]
        assert renamed["name"] == "b"
        names = [w["name"] for w in daemon.call("workspace.list")["workspaces"]]
        assert names == ["b"], names
        assert not branch_exists(repo, "xum/b")
    finally:
        daemon.close()
