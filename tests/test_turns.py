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
