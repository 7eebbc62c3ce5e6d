"""The startup pass: rows left between intent and completion are settled or flagged, never
deleted; what cannot be proven is flagged for the user, who resolves it with ordinary calls."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from xum_client.errors import XumRpcError

from tests.crash.invariants import Before, branches, check, resolve
from tests.crash.world import World, make_dirty


def db(world: World) -> sqlite3.Connection:
    return sqlite3.connect(world.root / "state.db", isolation_level=None)


def recovery_status(world: World) -> dict[str, Any]:
    status: dict[str, Any] = world.call("daemon.status")["details"]["recovery"]
    return status


def test_creating_row_with_checkout_and_finished_setup_becomes_active(world: World) -> None:
    world.start()
    world.add_project()
    ws = world.create("a")
    world.d.terminate()
    # As a crash right after the setup outcome was written would leave it.
    with db(world) as conn:
        conn.execute("UPDATE workspaces SET state = 'creating' WHERE id = ?", (ws["id"],))
    world.start()
    after = world.ws(ws["id"])
    assert after is not None and after["state"] == "active" and not after["interrupted"]
    assert recovery_status(world)["last_pass"]["actions"] == {"completed": 1}


@pytest.mark.parametrize("runtime", ["worktree", "directory"])
def test_interrupted_creation_is_flagged_with_a_reason_and_kept(world: World, runtime: str) -> None:
    world.start()
    if runtime == "directory":
        plain = world.base / "plain"
        plain.mkdir()
        world.project_id = world.call("project.add", {"path": str(plain)})["project"]["id"]
    else:
        world.add_project()
    world.start("workspace.create.after_checkout")
    world.expect_killed(
        "workspace.create", {"project_id": world.project_id, "name": "a", "runtime": runtime}
    )
    world.start()
    (ws,) = world.workspaces()
    assert ws["state"] == "creating" and ws["interrupted"]
    assert "setup never finished" in ws["interrupted_reason"]
    assert "recovery.workspace_reconciled" in world.d.log_text()
    # The subscription snapshot shows it to every client that connects after the pass.
    with world.d.client() as client:
        snap = client.call("events.subscribe", {})["snapshot"]
    assert [w["interrupted"] for w in snap["workspaces"]] == [True]
    assert recovery_status(world)["interrupted"] == 1
    # A second start changes nothing: the flag and the reason stay until the user decides.
    world.start()
    assert world.ws(ws["id"]) == ws
    kept = world.call("workspace.keep", {"workspace_id": ws["id"]})["workspace"]
    assert kept["state"] == "active" and not kept["interrupted"]
    assert recovery_status(world)["interrupted"] == 0


def test_foreign_directory_at_the_path_is_flagged_and_left_alone(world: World) -> None:
    world.start()
    world.add_project()
    world.start("workspace.create.after_intent")
    world.expect_killed("workspace.create", {"project_id": world.project_id, "name": "a"})
    path = world.root / "workspaces" / "repo" / "a"
    path.mkdir(parents=True)
    (path / "mine.txt").write_text("someone else's\n")
    world.start()
    (ws,) = world.workspaces()
    assert ws["interrupted"] and "marker" in ws["interrupted_reason"]
    with pytest.raises(XumRpcError):
        world.call("workspace.keep", {"workspace_id": ws["id"]})
    world.call("workspace.remove", {"workspace_id": ws["id"]})
    world.finish_cleanup()
    assert (path / "mine.txt").read_text() == "someone else's\n"
    assert world.workspaces() == []


def test_rename_that_cannot_be_proven_is_flagged(world: World) -> None:
    world.start()
    world.add_project()
    ws = world.create("a")
    dirty = make_dirty(Path(ws["path"]))
    before = Before(branches=branches(world.repo), dirty={ws["id"]: dirty})
    world.start("workspace.rename.after_journal")
    world.expect_killed("workspace.rename", {"workspace_id": ws["id"], "name": "b"})
    squatter = Path(ws["path"]).parent / "b"
    squatter.mkdir()  # both spellings exist now: neither direction is provable
    world.start()
    after = world.ws(ws["id"])
    assert after is not None and after["interrupted"] and after["name"] == "a"
    assert "neither state" in after["interrupted_reason"]
    squatter.rmdir()
    resolve(world)
    renamed = world.call("workspace.rename", {"workspace_id": ws["id"], "name": "b"})
    assert renamed["workspace"]["name"] == "b"
    before.renamed = {"xum/a": "xum/b"}
    assert not check(world, before, where="after rename")


def test_rename_rolls_forward_when_only_the_new_path_exists(world: World) -> None:
    world.start()
    world.add_project()
    ws = world.create("a")
    world.start("workspace.rename.after_move")
    world.expect_killed("workspace.rename", {"workspace_id": ws["id"], "name": "b"})
    world.start()
    after = world.ws(ws["id"])
    assert after is not None and not after["interrupted"]
    assert (after["name"], after["branch"], Path(after["path"]).name) == ("b", "xum/b", "b")
    assert "xum/a" not in branches(world.repo)
    assert recovery_status(world)["last_pass"]["actions"] == {"rename_rolled_forward": 1}


def test_missing_active_checkout_is_reported_not_flagged(world: World) -> None:
    world.start()
    world.add_project()
    ws = world.create("a")
    world.d.terminate()
    (Path(ws["path"]) / ".git").unlink()
    shutil.rmtree(ws["path"])
    world.start()
    status = recovery_status(world)
    assert status["last_pass"]["missing_checkouts"] == 1
    after = world.ws(ws["id"])
    assert after is not None and after["state"] == "active" and not after["interrupted"]


def test_interrupted_creation_removed_by_the_user_keeps_the_branch(world: World) -> None:
    world.start()
    world.add_project()
    world.start("workspace.setup.after_intent")
    world.expect_killed("workspace.create", {"project_id": world.project_id, "name": "a"})
    world.start()
    (ws,) = world.workspaces()
    assert ws["interrupted"] and Path(ws["path"]).is_dir()
    (Path(ws["path"]) / "work.txt").write_text("made after the crash\n")
    # A confirmed removal: not_safe while work is unsaved, then with force (snapshot first).
    with pytest.raises(XumRpcError) as refused:
        world.call("workspace.remove", {"workspace_id": ws["id"]})
    assert refused.value.data["kind"] == "not_safe"
    removed = world.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    assert removed["branch"] == "xum/a" and removed["snapshot"] is not None
    world.finish_cleanup()
    assert not Path(ws["path"]).exists()
    assert "xum/a" in branches(world.repo)
    before = Before(
        branches=branches(world.repo), dirty={ws["id"]: {"work.txt": "made after the crash\n"}}
    )
    assert not check(world, before, where="after remove")
