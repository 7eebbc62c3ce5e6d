"""Small lifecycle fixes: setup's completion is durable across a crash,
`archive {stop}` names the processes it stopped, and unarchive after a checkout deleted by hand
settles git's stale admin entry instead of failing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from xum_client.errors import XumRpcError

from tests.crash.world import World
from tests.support.gitrepo import git
from tests.support.lifecycle_helpers import worktrees


def test_crash_after_setup_is_not_flagged_as_unfinished_setup(world: World) -> None:
    """SIGKILL at workspace.create.after_setup: setup ran to completion, so recovery completes
    the workspace (active, setup ok) instead of flagging "setup never finished"."""
    world.start()
    world.add_project()
    world.start("workspace.create.after_setup")
    world.expect_killed("workspace.create", {"project_id": world.project_id, "name": "a"})
    world.start()
    (ws,) = world.workspaces()
    assert not ws["interrupted"], ws["interrupted_reason"]
    assert ws["state"] == "active"
    assert ws["setup"]["status"] == "none"


def test_crash_after_unarchive_setup_is_not_flagged(world: World) -> None:
    world.start()
    world.add_project()
    ws = world.create("a")
    world.call("workspace.archive", {"workspace_id": ws["id"]})
    world.finish_cleanup()
    world.start("workspace.unarchive.after_setup")
    world.expect_killed("workspace.unarchive", {"workspace_id": ws["id"]})
    world.start()
    after = world.ws(ws["id"])
    assert after is not None
    assert not after["interrupted"], after["interrupted_reason"]
    assert after["state"] == "active" and after["setup"]["status"] == "none"


def test_archive_stop_reports_the_ids_of_the_processes_it_stopped(world: World) -> None:
    world.start()
    world.add_project()
    ws = world.create("a")
    procs = [
        world.call(
            "process.spawn", {"workspace_id": ws["id"], "kind": "exec", "argv": ["sleep", "60"]}
        )["process"]
        for _ in range(2)
    ]
    done = world.call("workspace.archive", {"workspace_id": ws["id"], "stop": True})
    assert sorted(done["stopped"]) == sorted(p["id"] for p in procs)
    for proc in procs:
        got = world.call("process.get", {"process_id": proc["id"]})["process"]
        assert got["state"] == "exited", got
    # Nothing running: nothing to name.
    world.call("workspace.unarchive", {"workspace_id": ws["id"]})
    again = world.call("workspace.archive", {"workspace_id": ws["id"], "stop": True})
    assert again["stopped"] == []


def test_unarchive_right_after_archiving_a_checkout_deleted_by_hand(world: World) -> None:
    """The user deletes the checkout by hand and archives: git's admin entry (locked, so no
    prune takes it) still says the branch is checked out there. An immediate unarchive settles
    that entry (ours: its lock reason is our marker) and recreates the checkout."""
    world.start()
    world.add_project()
    ws = world.create("a")
    path = Path(ws["path"])
    shutil.rmtree(path)
    archived = world.call("workspace.archive", {"workspace_id": ws["id"]})
    assert archived["workspace"]["state"] == "archived", archived
    back = world.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert back["workspace"]["state"] == "active"
    assert (path / "README.md").read_text() == "hello\n"
    listed = worktrees(world.repo)
    assert str(path) in listed and listed[str(path)]["branch"] == "refs/heads/xum/a"


def test_unarchive_refuses_an_admin_entry_that_is_not_ours(world: World) -> None:
    """A missing worktree of the user's own registered at the workspace's path is not ours to
    drop: `conflict` naming the entry and the way out; nothing changes."""
    world.start()
    world.add_project()
    ws = world.create("a")
    path = Path(ws["path"])
    world.call("workspace.archive", {"workspace_id": ws["id"]})
    world.finish_cleanup()
    git(world.repo, "worktree", "add", "--lock", "-b", "mine", str(path))
    shutil.rmtree(path)
    with pytest.raises(XumRpcError) as info:
        world.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert info.value.kind == "conflict"
    assert "git worktree prune" in info.value.message
    assert str(path) in worktrees(world.repo)  # the user's entry is left alone
    after = world.ws(ws["id"])
    assert after is not None and after["state"] == "archived"
    git(world.repo, "worktree", "unlock", str(path))
    git(world.repo, "worktree", "prune")
    back = world.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert back["workspace"]["state"] == "active"
