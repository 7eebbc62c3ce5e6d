"""Delegated workspace turns: the daemon makes the handle and writes the binding with the
target's intent row; a client can never forge it; a crash keeps the target bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from xum_client.errors import XumRpcError

from tests.crash.world import World


def kind_of(world: World, method: str, params: dict[str, Any]) -> str:
    answer = world.try_call(method, params)
    assert isinstance(answer, XumRpcError), f"{method} {params} succeeded: {answer}"
    return str(answer.data.get("kind"))


def test_new_turn_binds_owner_target_and_handle(world: World) -> None:
    world.start()
    world.add_project()
    owner = world.create("owner")
    made = world.call(
        "turn.create", {"owner_workspace_id": owner["id"], "mode": "new", "name": "sub"}
    )
    turn, target = made["turn"], made["workspace"]
    assert turn["id"].startswith("turn_") and turn["state"] == "open"
    assert turn["mode"] == "new"
    assert turn["owner_workspace_id"] == owner["id"]
    assert turn["target_workspace_id"] == target["id"]
    assert target["name"] == "sub" and target["state"] == "active"
    assert target["handle_id"] == turn["id"] and target["owner_workspace_id"] == owner["id"]
    assert Path(target["path"]).is_dir()
    assert made["setup"]["status"] == "none"
    # The binding is durable: a restart sees it unchanged.
    world.start()
    again = world.call("workspace.get", {"workspace_id": target["id"]})["workspace"]
    assert (again["handle_id"], again["owner_workspace_id"]) == (turn["id"], owner["id"])
    assert world.call("turn.get", {"handle_id": turn["id"]})["turn"]["state"] == "open"
    listed = world.call("turn.list", {"owner_workspace_id": owner["id"]})["turns"]
    assert [t["id"] for t in listed] == [turn["id"]]


def test_existing_mode_reuses_only_a_bound_target(world: World) -> None:
    world.start()
    world.add_project()
    owner = world.create("owner")
    other = world.create("other")
    target = world.call("turn.create", {"owner_workspace_id": owner["id"], "mode": "new"})[
        "workspace"
    ]
    reused = world.call(
        "turn.create",
        {
            "owner_workspace_id": owner["id"],
            "mode": "existing",
            "target_workspace_id": target["id"],
        },
    )
    assert reused["turn"]["mode"] == "existing" and reused["setup"] is None
    assert reused["workspace"]["id"] == target["id"]
    # A workspace the owner did not delegate to (made by workspace.create) is out of scope...
    bad = {
        "owner_workspace_id": owner["id"],
        "mode": "existing",
        "target_workspace_id": other["id"],
    }
    assert kind_of(world, "turn.create", bad) == "invalid_scope"
    # ...and so is another owner's target.
    bad = {
        "owner_workspace_id": other["id"],
        "mode": "existing",
        "target_workspace_id": target["id"],
    }
    assert kind_of(world, "turn.create", bad) == "invalid_scope"
    # Anything but new/existing, or a mode with the other mode's fields, is invalid_scope.
    for params in (
        {"owner_workspace_id": owner["id"], "mode": "fork"},
        {"owner_workspace_id": owner["id"], "mode": "existing"},
        {"owner_workspace_id": owner["id"], "mode": "new", "target_workspace_id": target["id"]},
        {"owner_workspace_id": target["id"].replace("ws_", "prj_"), "mode": "new"},
    ):
        assert kind_of(world, "turn.create", params) == "invalid_scope", params
    unknown = {"owner_workspace_id": "ws_0123456789abcdef", "mode": "new"}
    assert kind_of(world, "turn.create", unknown) == "not_found"
    assert len(world.call("turn.list", {"owner_workspace_id": owner["id"]})["turns"]) == 2


def test_a_client_cannot_forge_the_binding(world: World) -> None:
    world.start()
    world.add_project()
    owner = world.create("owner")
    for field in ("handle_id", "owner_workspace_id"):
        params = {"project_id": world.project_id, "name": "forged", field: "x"}
        if field == "owner_workspace_id":
            params[field] = owner["id"]
        assert kind_of(world, "workspace.create", params) == "invalid_params"
    assert [w["name"] for w in world.workspaces()] == ["owner"]


def test_end_get_list_errors(world: World) -> None:
    world.start()
    world.add_project()
    owner = world.create("owner")
    turn = world.call("turn.create", {"owner_workspace_id": owner["id"], "mode": "new"})["turn"]
    ended = world.call("turn.end", {"handle_id": turn["id"]})["turn"]
    assert ended["state"] == "ended" and ended["ended_at"] is not None
    assert kind_of(world, "turn.end", {"handle_id": turn["id"]}) == "invalid_state"
    assert kind_of(world, "turn.get", {"handle_id": "turn_0123456789abcdef"}) == "not_found"
    assert kind_of(world, "turn.get", {"handle_id": owner["id"]}) == "invalid_scope"
    assert kind_of(world, "turn.end", {"handle_id": "turn_nothex"}) == "not_found"
    gone = {"owner_workspace_id": "ws_0123456789abcdef"}
    assert kind_of(world, "turn.list", gone) == "not_found"
    assert kind_of(world, "turn.list", {"owner_workspace_id": turn["id"]}) == "invalid_scope"
    # The target is not touched by ending the turn.
    target = world.ws(turn["target_workspace_id"])
    assert target is not None and target["state"] == "active"


def test_failed_target_creation_fails_the_turn(world: World) -> None:
    world.start()
    world.add_project()
    owner = world.create("owner")
    params = {"owner_workspace_id": owner["id"], "mode": "new", "base": "no-such-commit"}
    assert kind_of(world, "turn.create", params) == "not_found"
    # The path is taken: the intent row is committed, then the create undoes itself.
    blocked = Path(owner["path"]).parent / "blocked"
    blocked.mkdir()
    params = {"owner_workspace_id": owner["id"], "mode": "new", "name": "blocked"}
    assert kind_of(world, "turn.create", params) == "conflict"
    turns = world.call("turn.list", {"owner_workspace_id": owner["id"]})["turns"]
    assert [(t["state"], t["reason"] is not None) for t in turns] == [("failed", True)]
    assert world.ws(turns[0]["target_workspace_id"]) is None


@pytest.mark.parametrize(
    ("point", "checkout"),
    [("workspace.create.after_intent", False), ("workspace.create.after_checkout", True)],
)
def test_interrupted_target_stays_bound(world: World, point: str, checkout: bool) -> None:
    """The seed's orphan: a crash while the target is being created. The target row exists
    (intent first), is flagged interrupted, and stays bound to its owner and handle."""
    world.start()
    world.add_project()
    owner = world.create("owner")
    world.start(point)  # the owner's own create must not reach the point
    world.expect_killed("turn.create", {"owner_workspace_id": owner["id"], "mode": "new"})
    world.start()
    (turn,) = world.call("turn.list", {"owner_workspace_id": owner["id"]})["turns"]
    target = world.ws(turn["target_workspace_id"])
    assert target is not None
    assert target["state"] == "creating" and target["interrupted"]
    assert target["interrupted_reason"]
    assert (target["handle_id"], target["owner_workspace_id"]) == (turn["id"], owner["id"])
    assert turn["state"] == "open" and turn["target_interrupted"]
    assert Path(target["path"]).is_dir() == checkout
    # Not reusable until the user decides; then keep (checkout there) or remove.
    reuse = {
        "owner_workspace_id": owner["id"],
        "mode": "existing",
        "target_workspace_id": target["id"],
    }
    assert kind_of(world, "turn.create", reuse) == "invalid_state"
    if checkout:
        kept = world.call("workspace.keep", {"workspace_id": target["id"]})["workspace"]
        assert kept["state"] == "active" and not kept["interrupted"]
        assert kept["handle_id"] == turn["id"]
        world.call("turn.create", reuse)
    else:
        assert kind_of(world, "workspace.keep", {"workspace_id": target["id"]}) == "invalid_state"
        world.call("workspace.remove", {"workspace_id": target["id"]})
        assert world.ws(target["id"]) is None
        assert kind_of(world, "turn.create", reuse) == "not_found"


# -- runtime: a delegated turn in a plain-directory project -------------------------------


def add_plain_project(world: World) -> str:
    """A plain directory (no git) as the world's project."""
    plain = world.base / "plain"
    plain.mkdir()
    (plain / "README").write_text("a plain directory\n")
    world.project_id = world.call("project.add", {"path": str(plain)})["project"]["id"]
    return world.project_id


def test_a_turn_in_a_plain_directory_project_is_a_directory(world: World) -> None:
    world.start()
    add_plain_project(world)
    owner = world.create("owner", runtime="directory")
    made = world.call("turn.create", {"owner_workspace_id": owner["id"], "mode": "new"})
    turn, target = made["turn"], made["workspace"]
    # By default the target works like its owner: a directory, bound to the owner and handle.
    assert target["runtime"] == "directory" and target["state"] == "active"
    assert target["branch"] is None and Path(target["path"]).is_dir()
    assert (target["handle_id"], target["owner_workspace_id"]) == (turn["id"], owner["id"])
    assert turn["state"] == "open" and made["setup"]["status"] == "none"
    explicit = world.call(
        "turn.create",
        {"owner_workspace_id": owner["id"], "mode": "new", "runtime": "directory", "name": "d"},
    )["workspace"]
    assert explicit["runtime"] == "directory" and explicit["name"] == "d"
    # A worktree needs a git repository; a directory takes no base: refused before any row.
    for bad in (
        {"owner_workspace_id": owner["id"], "mode": "new", "runtime": "worktree"},
        {"owner_workspace_id": owner["id"], "mode": "new", "base": "HEAD"},
    ):
        assert kind_of(world, "turn.create", bad) == "invalid_params", bad
    # `existing` reuses a target as it is: a runtime there is out of scope.
    reuse = {
        "owner_workspace_id": owner["id"],
        "mode": "existing",
        "target_workspace_id": target["id"],
        "runtime": "directory",
    }
    assert kind_of(world, "turn.create", reuse) == "invalid_scope"
    del reuse["runtime"]
    assert world.call("turn.create", reuse)["workspace"]["id"] == target["id"]
    turns = world.call("turn.list", {"owner_workspace_id": owner["id"]})["turns"]
    # The refused creates left failed turns only if they got as far as a row: they did not.
    assert sorted(t["state"] for t in turns) == ["open", "open", "open"]
    assert sorted(w["name"] for w in world.workspaces()) == sorted(["owner", target["name"], "d"])


def test_cli_turn_new_takes_a_runtime(world: World) -> None:
    import json
    import subprocess
    import sys

    world.start()
    world.add_project()
    world.create("owner")
    xum = str(Path(sys.executable).parent / "xum")
    done = subprocess.run(
        [
            xum,
            "--root",
            str(world.root),
            "--json",
            "turn",
            "new",
            "repo/owner",
            "--runtime",
            "directory",
            "--name",
            "sub",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["workspace"]["runtime"] == "directory"


def test_a_directory_turn_in_a_git_project(world: World) -> None:
    world.start()
    world.add_project()
    owner = world.create("owner")
    made = world.call(
        "turn.create", {"owner_workspace_id": owner["id"], "mode": "new", "runtime": "directory"}
    )["workspace"]
    assert made["runtime"] == "directory" and made["branch"] is None
    dir_owner = world.create("downer", runtime="directory")
    inherited = world.call("turn.create", {"owner_workspace_id": dir_owner["id"], "mode": "new"})
    assert inherited["workspace"]["runtime"] == "directory"
    worktree = world.call(
        "turn.create",
        {"owner_workspace_id": dir_owner["id"], "mode": "new", "runtime": "worktree"},
    )
    assert worktree["workspace"]["runtime"] == "worktree"


def directory_turn_points() -> list[str]:
    """Every kill point a directory target's creation passes (the worktree matrix's points of
    turn.create, create and setup; the undo points need a failing checkout, and a carry a git
    checkout: not reachable)."""
    from tests.recovery.test_crash_matrix import POINTS

    prefixes = ("turn.create.", "workspace.create.", "workspace.setup.")
    unreachable = (".undo.", ".carry.")
    return [p for p in POINTS if p.startswith(prefixes) and not any(u in p for u in unreachable)]


@pytest.mark.parametrize("point", directory_turn_points())
def test_directory_turn_crash(world: World, point: str) -> None:
    """The worktree crash matrix's turn driver, for a directory target in a plain-directory
    project: SIGKILL at the point, restart, the invariants hold, the turn is open and bound
    (or failed with its target gone), and the user finishes with ordinary calls."""
    from tests.crash.invariants import Before, check, resolve

    world.start()
    add_plain_project(world)
    owner = world.create("owner", runtime="directory")
    (Path(owner["path"]) / "work.txt").write_text("the owner's work\n")
    world.start(point)  # the owner's own create must not reach the point
    world.expect_killed("turn.create", {"owner_workspace_id": owner["id"], "mode": "new"})
    assert f"fault point {point} reached" in world.d.log_text()
    world.start()
    problems = check(world, Before(), where=f"{point}: after restart")
    assert not problems, "\n".join(problems)
    (turn,) = world.call("turn.list", {"owner_workspace_id": owner["id"]})["turns"]
    target = world.ws(turn["target_workspace_id"])
    if turn["state"] == "open":
        assert target is not None and target["runtime"] == "directory"
        assert (target["handle_id"], target["owner_workspace_id"]) == (turn["id"], owner["id"])
    else:
        assert turn["state"] == "failed" and target is None, (turn, target)
    resolve(world)
    target = world.ws(turn["target_workspace_id"])
    if target is not None:
        reuse = {
            "owner_workspace_id": owner["id"],
            "mode": "existing",
            "target_workspace_id": target["id"],
        }
        assert world.call("turn.create", reuse)["workspace"]["runtime"] == "directory"
    else:
        made = world.call("turn.create", {"owner_workspace_id": owner["id"], "mode": "new"})
        assert made["workspace"]["runtime"] == "directory"
    assert (Path(owner["path"]) / "work.txt").read_text() == "the owner's work\n"
    problems = check(world, Before(), where=f"{point}: after the user finished")
    assert not problems, "\n".join(problems)
    assert not [w for w in world.workspaces() if w["interrupted"]]
