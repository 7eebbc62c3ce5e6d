"""Drivers: for each fault-point prefix, the operation that reaches the point over the socket, and
how a user completes (or undoes) it afterwards with ordinary calls. A point whose name matches no
prefix has no driver: the crash matrix fails, so a new point is never silently uncovered."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xum_client.errors import XumClientError

from tests.crash.invariants import Before, branches
from tests.crash.world import FAST_CLEANUP, World, make_dirty
from tests.support.daemon import write_config
from tests.support.gitrepo import commit_config, git
from tests.support.wait import until


@dataclass
class Run:
    before: Before
    subject: str | None
    finish: Callable[[World], None]
    """Complete or undo the interrupted operation with ordinary calls (asserting they work)."""
    info: dict[str, Any]


def _ok(world: World, method: str, params: dict[str, Any]) -> dict[str, Any]:
    answer = world.try_call(method, params)
    assert isinstance(answer, dict), f"{method} {params} failed after recovery: {answer}"
    return answer


def _dirty_workspace(world: World, name: str = "a") -> tuple[dict[str, Any], Before]:
    ws = world.create(name)
    dirty = make_dirty(Path(ws["path"]))
    return ws, Before(branches=branches(world.repo), dirty={ws["id"]: dirty})


def _ensure_active(world: World, wid: str) -> None:
    """Whatever state the crash left, bring the workspace back to active with ordinary calls."""
    w = world.ws(wid)
    assert w is not None, f"{wid} vanished"
    if w["state"] == "archived":
        world.finish_cleanup()
        _ok(world, "workspace.unarchive", {"workspace_id": wid})
    w = world.ws(wid)
    assert w is not None and w["state"] == "active", f"{wid} is not active: {w}"


# -- drivers (each starts the daemon with `point` armed and dies there) ----------------------------


def drive_create(world: World, point: str) -> Run:
    world.start(point)
    world.add_project()
    before = Before(branches=branches(world.repo))
    params = {"project_id": world.project_id, "name": "a", "request_key": "crash-create-a"}
    world.expect_killed("workspace.create", params)

    def finish(w: World) -> None:
        found = [x for x in w.workspaces() if x["name"] == "a"]
        # The same call again, with its key: answered as the disk has it (the workspace the
        # first one made, or a create now when recovery took it back), never a second one.
        made = _ok(w, "workspace.create", params)
        if found:
            assert found[0]["state"] == "active", found[0]
            assert made["workspace"]["id"] == found[0]["id"], (made, found)
        assert [x["id"] for x in w.workspaces() if x["name"] == "a"] == [made["workspace"]["id"]]
        _ok(w, "workspace.archive", {"workspace_id": _id_of(w, "a")})

    return Run(before, None, finish, {})


def _id_of(world: World, name: str) -> str:
    for w in world.workspaces():
        if w["name"] == name:
            return str(w["id"])
    raise AssertionError(f"no workspace {name}")


def drive_archive(world: World, point: str) -> Run:
    world.start(point)
    world.add_project()
    ws, before = _dirty_workspace(world)
    params = {"workspace_id": ws["id"], "request_key": "crash-archive-a"}
    world.expect_killed("workspace.archive", params)

    def finish(w: World) -> None:
        # The same call again, with its key: the archive the first one committed, or an
        # archive now when it committed nothing (never `invalid_state` for its own archive).
        archived = _ok(w, "workspace.archive", params)
        assert archived["workspace"]["id"] == ws["id"], archived
        assert archived["workspace"]["state"] == "archived", archived
        _ensure_active(w, ws["id"])

    return Run(before, ws["id"], finish, {})


def drive_unarchive(world: World, point: str) -> Run:
    world.start(point)
    world.add_project()
    ws, before = _dirty_workspace(world)
    _ok(world, "workspace.archive", {"workspace_id": ws["id"]})
    world.finish_cleanup()
    world.expect_killed("workspace.unarchive", {"workspace_id": ws["id"]})

    def finish(w: World) -> None:
        _ensure_active(w, ws["id"])

    return Run(before, ws["id"], finish, {})


def drive_remove(world: World, point: str) -> Run:
    world.start(point)
    world.add_project()
    ws, before = _dirty_workspace(world)
    world.expect_killed("workspace.remove", {"workspace_id": ws["id"], "force": True})

    def finish(w: World) -> None:
        if w.ws(ws["id"]) is not None:
            _ok(w, "workspace.remove", {"workspace_id": ws["id"], "force": True})
        assert w.ws(ws["id"]) is None

    return Run(before, ws["id"], finish, {})


def drive_rename(world: World, point: str) -> Run:
    world.start(point)
    world.add_project()
    ws, before = _dirty_workspace(world)
    before.renamed = {"xum/a": "xum/b"}
    world.expect_killed("workspace.rename", {"workspace_id": ws["id"], "name": "b"})

    def finish(w: World) -> None:
        current = w.ws(ws["id"])
        assert current is not None
        if current["name"] == "a":
            _ok(w, "workspace.rename", {"workspace_id": ws["id"], "name": "b"})
        current = w.ws(ws["id"])
        assert current is not None and current["name"] == "b", current
        assert current["branch"] == "xum/b" and Path(current["path"]).name == "b", current
        assert not Path(ws["path"]).exists(), "the old path is still there"

    return Run(before, ws["id"], finish, {})


def drive_turn(world: World, point: str) -> Run:
    world.start(point)
    world.add_project()
    owner, before = _dirty_workspace(world, "owner")
    world.expect_killed("turn.create", {"owner_workspace_id": owner["id"], "mode": "new"})

    def finish(w: World) -> None:
        turns = _ok(w, "turn.list", {"owner_workspace_id": owner["id"]})["turns"]
        assert len(turns) == 1, turns
        turn = turns[0]
        target = w.ws(turn["target_workspace_id"])
        if turn["state"] == "open" and target is not None:
            assert target["handle_id"] == turn["id"]
            assert target["owner_workspace_id"] == owner["id"]
            _ok(
                w,
                "turn.create",
                {
                    "owner_workspace_id": owner["id"],
                    "mode": "existing",
                    "target_workspace_id": target["id"],
                },
            )
            _ok(w, "turn.end", {"handle_id": turn["id"]})
        else:
            assert turn["state"] == "failed", turn
            _ok(w, "turn.create", {"owner_workspace_id": owner["id"], "mode": "new"})

    return Run(before, owner["id"], finish, {})


def drive_cleanup(world: World, point: str) -> Run:
    world.start(point)
    world.add_project()
    ws, before = _dirty_workspace(world)
    (Path(ws["path"]) / "node_modules").mkdir()
    (Path(ws["path"]) / "node_modules" / "dep.js").write_text("ignored\n")
    # The archive answers (its logical part is committed) or not; the daemon dies in cleanup.
    world.expect_killed("workspace.archive", {"workspace_id": ws["id"]})

    def finish(w: World) -> None:
        _ensure_active(w, ws["id"])

    return Run(before, ws["id"], finish, {})


GC_BUDGET = (
    FAST_CLEANUP
    + '[gc]\nmax_bytes = 1\nrebuildable = ["node_modules/"]\nidle_after_s = 0\n'
    + "budget_interval_s = 3600\n"
)
"""A budget no root meets (1 byte): every idle workspace's node_modules is evicted by gc.run."""


def drive_evict(world: World, point: str) -> Run:
    # The workspace is made before the budget is set: a create is refused before it writes
    # when the budget has no room for it (lifecycle/capacity.py).
    world.start()
    world.add_project()
    ws, before = _dirty_workspace(world)
    modules = Path(ws["path"]) / "node_modules"
    modules.mkdir()
    (modules / "dep.js").write_text("rebuildable\n")
    write_config(world.root, GC_BUDGET)
    world.start(point)
    world.expect_killed("gc.run", {})

    def finish(w: World) -> None:
        # Moved or not, the next run evicts it; its reclaim empties the trash.
        _ok(w, "gc.run", {})
        assert not modules.exists()
        w.finish_cleanup()
        trash = w.root / "trash"
        assert not trash.is_dir() or not any(trash.iterdir())

    return Run(before, ws["id"], finish, {})


def drive_spawn(world: World, point: str) -> Run:
    world.start(point)
    world.add_project()
    ws, before = _dirty_workspace(world)
    world.expect_killed(
        "process.spawn", {"workspace_id": ws["id"], "kind": "exec", "argv": ["sleep", "30"]}
    )

    def finish(w: World) -> None:
        _ok(w, "workspace.archive", {"workspace_id": ws["id"], "stop": True})
        _ensure_active(w, ws["id"])

    return Run(before, ws["id"], finish, {})


# -- undo paths: the operation fails part-way (for real), and the daemon dies inside its undo ----


def _failing_checkout(world: World) -> Path:
    """A post-checkout hook that fails while a flag file exists: `git worktree add` then exits
    non-zero after it made the worktree (and its new branch), so create/unarchive undo them."""
    flag = world.base / "fail-checkout"
    hook = world.repo / ".git" / "hooks" / "post-checkout"
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text(
        f'#!/bin/sh\nif [ -e "{flag}" ]; then echo "checkout refused" >&2; exit 1; fi\n'
    )
    hook.chmod(0o755)
    flag.touch()
    return flag


def drive_create_undo(world: World, point: str) -> Run:
    world.start(point)
    world.add_project()
    before = Before(branches=branches(world.repo))
    flag = _failing_checkout(world)
    world.expect_killed("workspace.create", {"project_id": world.project_id, "name": "u"})

    def finish(w: World) -> None:
        assert [x for x in w.workspaces() if x["name"] == "u"] == [], "resolve removed it"
        flag.unlink()
        created = _ok(w, "workspace.create", {"project_id": w.project_id, "name": "u"})
        assert created["workspace"]["state"] == "active"

    return Run(before, None, finish, {})


def drive_unarchive_undo(world: World, point: str) -> Run:
    world.start(point)
    world.add_project()
    ws, before = _dirty_workspace(world)
    _ok(world, "workspace.archive", {"workspace_id": ws["id"]})
    world.finish_cleanup()
    flag = _failing_checkout(world)
    world.expect_killed("workspace.unarchive", {"workspace_id": ws["id"]})

    def finish(w: World) -> None:
        flag.unlink()
        _ensure_active(w, ws["id"])

    return Run(before, ws["id"], finish, {})


def drive_rename_undo(world: World, point: str) -> Run:
    world.start(point)
    world.add_project()
    ws, before = _dirty_workspace(world)
    # `xum/b/x` blocks the branch `xum/b` (a ref cannot be a file and a directory), which the
    # rename's own check (no ref `xum/b`) does not see: the checkout moves, then `git branch -m`
    # fails, and the undo moves the checkout back.
    git(world.repo, "branch", "xum/b/x")
    before.branches.add("xum/b/x")
    before.renamed = {"xum/a": "xum/c"}
    world.expect_killed("workspace.rename", {"workspace_id": ws["id"], "name": "b"})

    def finish(w: World) -> None:
        current = w.ws(ws["id"])
        assert current is not None
        if current["name"] == "b":
            # Recovery rolled forward (the checkout was at the new path); the branch that
            # cannot be renamed was kept.
            assert current["branch"] == "xum/a" and Path(current["path"]).name == "b", current
        else:
            assert current["name"] == "a" and current["branch"] == "xum/a", current
            _ok(w, "workspace.rename", {"workspace_id": ws["id"], "name": "c"})
            current = w.ws(ws["id"])
            assert current is not None and current["branch"] == "xum/c", current
        assert not Path(ws["path"]).exists(), "the old path is still there"

    return Run(before, ws["id"], finish, {})


def _holds(checkout: Path, files: dict[str, str]) -> bool:
    return all(
        (checkout / rel).is_file() and (checkout / rel).read_text() == text
        for rel, text in files.items()
    )


def drive_carry(world: World, point: str) -> Run:
    """`workspace.create {carry: move}` of the main checkout's work, cut at a carry point:
    the work is in the main checkout or in the new workspace (or both) at every step."""
    world.start(point)
    world.add_project()
    dirty = make_dirty(world.repo)
    before = Before(branches=branches(world.repo))
    world.expect_killed(
        "workspace.create", {"project_id": world.project_id, "name": "a", "carry": "move"}
    )

    def finish(w: World) -> None:
        found = [x for x in w.workspaces() if x["name"] == "a"]
        if found and _holds(Path(found[0]["path"]), dirty):
            return  # the new workspace holds the work (a move cut half way left the rest)
        assert not found or found[0]["state"] == "active", found
        # Not carried: the main checkout still holds all of it, untouched.
        assert _holds(w.repo, dirty), "the work is neither in the main checkout nor carried"
        assert git(w.repo, "diff", "--cached", "--name-only").split() == ["staged.txt"]
        if found:
            _ok(w, "workspace.remove", {"workspace_id": found[0]["id"], "force": True})
        made = _ok(
            w, "workspace.create", {"project_id": w.project_id, "name": "a", "carry": "move"}
        )
        assert made["carried"]["moved"] is True, made["carried"]
        assert _holds(Path(made["workspace"]["path"]), dirty)
        assert git(w.repo, "status", "--porcelain").strip() == ""

    return Run(before, None, finish, {})


RECOVERY_SETUP: dict[str, str] = {
    "recovery.rename.": "workspace.rename.after_move",
    "recovery.": "workspace.create.after_checkout",
}
"""A recovery point is reached during a restart: first crash where recovery has work."""


POOL_CONFIG = "[create]\npool = 1\n"


def _pool_entries(world: World, state: str | None = None) -> list[dict[str, Any]]:
    db = sqlite3.connect(f"file:{world.root / 'state.db'}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        found = [dict(r) for r in db.execute("SELECT * FROM pool_entries")]
    finally:
        db.close()
    return [e for e in found if state is None or e["state"] == state]


def drive_pool_refill(world: World, point: str) -> Run:
    """A project with `[create] pool = 1`: its first refill (woken by project.add) dies."""
    commit_config(world.repo, POOL_CONFIG)
    world.start(point)
    before = Before(branches=branches(world.repo))
    try:
        world.add_project()
    except (XumClientError, OSError):
        pass  # the refill may die before project.add's answer is read
    if world.armed_raise:
        # Raised in the background refill: the daemon lives on; the entry was taken back.
        reached = f"fault point {point} reached; raising"
        until(lambda: reached in world.d.log_text(), message=reached)
    else:
        world.wait_killed()

    def finish(w: World) -> None:
        w.project_id = _ok(w, "project.list", {})["projects"][0]["id"]
        # A first create (whatever the pool holds) asks for a refill; the next one is a hit.
        first = _ok(w, "workspace.create", {"project_id": w.project_id, "name": "a"})
        until(lambda: _pool_entries(w, "ready"), message="the pool refilled")
        made = _ok(w, "workspace.create", {"project_id": w.project_id, "name": "b"})
        assert made["pool"] == "hit", made["pool"]
        for ws in (first, made):
            _ok(w, "workspace.archive", {"workspace_id": ws["workspace"]["id"]})

    return Run(before, None, finish, {})


def drive_pool_claim(world: World, point: str) -> Run:
    """A create that claims the ready entry dies mid-claim; the keyed repeat then answers as
    the disk has it (the workspace the claim made, kept by the user, or a create now)."""
    commit_config(world.repo, POOL_CONFIG)
    world.start(point)
    world.add_project()
    until(lambda: _pool_entries(world, "ready"), message="a ready pool entry")
    before = Before(branches=branches(world.repo))
    params = {"project_id": world.project_id, "name": "a", "request_key": "crash-claim-a"}
    world.expect_killed("workspace.create", params)

    def finish(w: World) -> None:
        made = _ok(w, "workspace.create", params)
        found = [x for x in w.workspaces() if x["name"] == "a"]
        assert [x["id"] for x in found] == [made["workspace"]["id"]], (made, found)
        assert found[0]["state"] == "active", found[0]
        _ok(w, "workspace.archive", {"workspace_id": made["workspace"]["id"]})

    return Run(before, None, finish, {})


def drive_recovery(world: World, point: str) -> Run:
    inner = _longest(RECOVERY_SETUP, point)
    assert inner is not None
    setup_point = RECOVERY_SETUP[inner]
    run = driver_for(setup_point)
    assert run is not None
    first = run(world, setup_point)
    world.start(point, wait_ready=False)
    if world.armed_raise:
        # A root with records answers its socket before its startup passes (lazy_start): a
        # raise in a pass fails that build, the daemon lives on, and the next request builds
        # the graph and runs the passes again (the point raises once).
        world.d.wait_for_notify("READY=1")
        failed = "lazy_start.build_failed"
        until(lambda: failed in world.d.log_text(), message=failed)
    else:
        world.wait_killed()
    return first


DRIVERS: dict[str, Callable[[World, str], Run]] = {
    "workspace.create.": drive_create,
    "workspace.create.undo.": drive_create_undo,
    "workspace.create.carry.": drive_carry,
    "workspace.unarchive.undo.": drive_unarchive_undo,
    "workspace.rename.undo.": drive_rename_undo,
    "workspace.archive.": drive_archive,
    "workspace.unarchive.": drive_unarchive,
    "workspace.remove.": drive_remove,
    "workspace.rename.": drive_rename,
    "workspace.setup.": drive_create,
    "turn.create.": drive_turn,
    "cleanup.": drive_cleanup,
    "process.spawn.": drive_spawn,
    "recovery.": drive_recovery,
    "pool.refill.": drive_pool_refill,
    "pool.claim.": drive_pool_claim,
    "gc.evict.": drive_evict,
}


def _longest(table: dict[str, Any], point: str) -> str | None:
    matches = [prefix for prefix in table if point.startswith(prefix)]
    return max(matches, key=len) if matches else None


def driver_for(point: str) -> Callable[[World, str], Run] | None:
    prefix = _longest(DRIVERS, point)
    return DRIVERS[prefix] if prefix else None
