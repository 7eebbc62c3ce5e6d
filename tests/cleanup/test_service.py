"""CleanupService on a real Store, real directories and real git worktrees: obligations committed
before they run, in order, fenced (incarnation, identity, marker, symlinks), trash + reclaim."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from xumd.cleanup.obligations import PENDING, ObligationRow
from xumd.cleanup.teardown_scripts import ProjectTeardown

from tests.cleanup.test_support import (
    ScriptTeardown,
    World,
    add_workspace,
    make_dir_checkout,
    make_worktree,
    make_world,
    set_workspace,
    ws_id,
)
from tests.support.daemon import short_tmpdir
from tests.support.gitrepo import git

FAIL_UNLESS_FLAG = (
    'if [ -f "$FLAG" ]; then echo teardown ok; exit 0; fi; '
    "echo 'stopping services...'; echo 'error: database still in use' >&2; exit 3"
)


@pytest.fixture
def base() -> Iterator[Path]:
    path = short_tmpdir("xumc-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def flag(base: Path) -> Path:
    return base / "flag"


@pytest.fixture
def world(base: Path, flag: Path) -> World:
    os.environ["FLAG"] = str(flag)
    return make_world(base, ScriptTeardown(FAIL_UNLESS_FLAG), backoff_initial_s=1.0)


def new_dir_ws(world: World, name: str, state: str = "archived") -> tuple[str, str, Path, tuple]:
    wid = ws_id(name)
    inc = secrets.token_hex(8)
    path = world.root / "workspaces" / name
    ident = make_dir_checkout(path, wid, inc)
    add_workspace(world.app, world.project_id, wid, path, inc, state)
    return wid, inc, path, ident


async def test_plan_joins_the_callers_transaction(world: World) -> None:
    wid, inc, path, ident = new_dir_ws(world, "a")
    with pytest.raises(RuntimeError), world.app.store.transaction():
        world.service.plan_checkout_removal(
            workspace_id=wid,
            project_id=world.project_id,
            incarnation=inc,
            runtime="directory",
            repo_path=world.repo,
            checkout=path,
            dev=ident[0],
            ino=ident[1],
            teardown=True,
        )
        raise RuntimeError("the logical change failed")
    assert world.service.obligations.for_workspace(wid) == []
    ids = world.plan(wid, path, inc, ident)
    rows = world.service.obligations.for_workspace(wid)
    assert [r.id for r in rows] == ids
    assert [r.kind for r in rows] == ["teardown", "trash", "reclaim"]
    assert all(r.state == PENDING for r in rows)


async def test_teardown_fails_then_succeeds_with_backoff_and_tail(world: World, flag: Path) -> None:
    wid, inc, path, ident = new_dir_ws(world, "a")
    world.plan(wid, path, inc, ident)
    status = await world.service.run_workspace(wid)
    assert status.status == "pending"
    assert status.attempts == 1
    assert status.last_error is not None and "database still in use" in status.last_error
    # Capped, jittered backoff: initial 1s, jitter 0.2 -> within [0.8, 1.0].
    assert status.next_attempt_at is not None
    assert 0.8 <= status.next_attempt_at - world.clock.now <= 1.0
    assert path.is_dir(), "deletion must wait for the teardown"
    assert world.states(wid) == {"teardown": "pending", "trash": "pending", "reclaim": "pending"}
    # The workspace row keeps the latest status for workspace.get.
    row = world.app.store.one("SELECT last_cleanup, state FROM workspaces WHERE id=?", (wid,))
    assert row is not None and '"pending"' in row["last_cleanup"]
    assert row["state"] == "archived"  # cleanup never changes the logical state

    # Not due yet: a cycle does nothing.
    result = await world.service.run_cycle("path")
    assert result.attempted == []
    flag.write_text("ok")
    world.clock.advance(1.0)
    result = await world.service.run_cycle("path")
    assert result.attempted == [wid]
    assert not os.path.lexists(path), "the path is free"
    status = world.service.status(wid)
    assert status is not None and status.status == "completed"
    assert status.reclaim is not None and status.reclaim.status == "pending"
    trash = world.service.obligations.for_workspace(wid)[1].detail["trash_path"]
    assert Path(trash).parent == world.root / "trash" and Path(trash).is_dir()

    await world.service.run_cycle("reclaim")
    status = world.service.status(wid)
    assert status is not None and status.reclaim is not None
    assert status.reclaim.status == "completed" and (status.reclaim.bytes or 0) >= 300
    assert not os.path.lexists(trash)


async def test_worktree_trash_drops_git_admin_entry(world: World, flag: Path) -> None:
    flag.write_text("ok")
    wid, inc = ws_id("wt"), secrets.token_hex(8)
    path = world.root / "workspaces" / "wt"
    ident = make_worktree(world.repo, path, wid, inc)
    add_workspace(world.app, world.project_id, wid, path, inc)
    assert str(path) in git(world.repo, "worktree", "list")
    world.plan(wid, path, inc, ident, runtime="worktree")
    status = await world.service.run_workspace(wid, include_reclaim=True)
    assert status.status == "completed", status
    assert status.reclaim is not None and status.reclaim.status == "completed"
    assert (status.reclaim.bytes or 0) >= 5000
    assert str(path) not in git(world.repo, "worktree", "list")
    assert not (world.repo / ".git" / "worktrees" / "wt").exists()
    # The branch no longer counts as checked out: git lets it be deleted (kept by xum normally).
    git(world.repo, "branch", "-D", f"b-{wid}")


async def test_live_replacement_at_the_same_path_survives(world: World, flag: Path) -> None:
    flag.write_text("ok")
    wid, old_inc, path, ident = new_dir_ws(world, "a")
    world.plan(wid, path, old_inc, ident)
    # Unarchived at the same path before the cleanup ran: a new incarnation lives there.
    shutil.rmtree(path)
    new_inc = secrets.token_hex(8)
    make_dir_checkout(path, wid, new_inc)
    (path / "work.txt").write_text("precious")
    set_workspace(world.app, wid, incarnation=new_inc, state="active")
    status = await world.service.run_workspace(wid, include_reclaim=True)
    assert (path / "work.txt").read_text() == "precious"
    obs = world.service.obligations.for_workspace(wid)
    assert {o.state for o in obs} == {"abandoned"}
    assert "another incarnation" in (obs[0].reason or "")
    teardown = world.service.steps.teardown_fn
    assert isinstance(teardown, ScriptTeardown) and teardown.calls == []
    assert status.status == "failed" and "another incarnation" in (status.reason or "")


async def test_stale_obligation_of_removed_workspace_vs_live_other_workspace(
    world: World, flag: Path
) -> None:
    flag.write_text("ok")
    wid, inc, path, ident = new_dir_ws(world, "a", state="removing")
    world.plan(wid, path, inc, ident)
    # Removal commits: row gone, tombstone written. Then another workspace is created there.
    with world.app.store.transaction():
        world.app.store.execute("DELETE FROM workspaces WHERE id=?", (wid,))
        world.app.store.execute(
            "INSERT INTO workspace_tombstones (id, project_id, name, removed_at) VALUES (?,?,?,0)",
            (wid, world.project_id, "a"),
        )
    shutil.rmtree(path)
    other, other_inc = ws_id("b"), secrets.token_hex(8)
    make_dir_checkout(path, other, other_inc)
    add_workspace(world.app, world.project_id, other, path, other_inc, state="active")
    await world.service.run_workspace(wid, include_reclaim=True)
    assert (path / ".xum-incarnation").read_text().split()[1] == other
    assert world.states(wid) == {
        "teardown": "abandoned",
        "trash": "abandoned",
        "reclaim": "abandoned",
    }


async def test_tombstoned_workspace_is_cleaned(world: World, flag: Path) -> None:
    flag.write_text("ok")
    wid, inc, path, ident = new_dir_ws(world, "a", state="removing")
    world.plan(wid, path, inc, ident)
    with world.app.store.transaction():
        world.app.store.execute("DELETE FROM workspaces WHERE id=?", (wid,))
        world.app.store.execute(
            "INSERT INTO workspace_tombstones (id, project_id, name, removed_at) VALUES (?,?,?,0)",
            (wid, world.project_id, "a"),
        )
    status = await world.service.run_workspace(wid)
    assert status.status == "completed"
    assert not os.path.lexists(path)


async def test_unknown_workspace_is_abandoned(world: World, flag: Path) -> None:
    flag.write_text("ok")
    wid, inc, path, ident = new_dir_ws(world, "a")
    world.plan(wid, path, inc, ident)
    with world.app.store.transaction():
        world.app.store.execute("DELETE FROM workspaces WHERE id=?", (wid,))
    await world.service.run_workspace(wid)
    assert path.is_dir()
    assert world.states(wid)["teardown"] == "abandoned"


async def test_foreign_directory_moved_into_the_path_is_left_alone(
    world: World, flag: Path
) -> None:
    flag.write_text("ok")
    wid, inc, path, ident = new_dir_ws(world, "a")
    world.plan(wid, path, inc, ident)
    shutil.rmtree(path)
    foreign = world.root.parent / "foreign"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("not xum's")
    os.rename(foreign, path)
    status = await world.service.run_workspace(wid)
    assert (path / "mine.txt").read_text() == "not xum's"
    ob = world.service.obligations.for_workspace(wid)[0]
    assert ob.state == "abandoned" and "replaced by a foreign one" in (ob.reason or "")
    assert status.status == "failed"
    await world.service.run_cycle("reclaim")  # nothing was moved to the trash: closed too
    listed = world.service.obligations.list(workspace_id=wid, state="abandoned", limit=10)
    assert len(listed) == 3


async def test_copied_directory_with_our_marker_is_foreign(world: World, flag: Path) -> None:
    flag.write_text("ok")
    wid, inc, path, ident = new_dir_ws(world, "a")
    world.plan(wid, path, inc, ident, teardown=False)
    shutil.copytree(path, world.root.parent / "copy")
    shutil.rmtree(path)
    os.rename(world.root.parent / "copy", path)  # same marker, another inode
    await world.service.run_workspace(wid)
    assert path.is_dir()
    assert "filesystem identity changed" in (
        world.service.obligations.for_workspace(wid)[0].reason or ""
    )


async def test_symlink_at_the_path_is_never_followed(world: World, flag: Path) -> None:
    flag.write_text("ok")
    wid, inc, path, ident = new_dir_ws(world, "a")
    world.plan(wid, path, inc, ident)
    moved = world.root.parent / "elsewhere"
    os.rename(path, moved)
    os.symlink(moved, path)
    await world.service.run_workspace(wid, include_reclaim=True)
    assert path.is_symlink() and (moved / "f0.txt").exists()
    assert "symlink" in (world.service.obligations.for_workspace(wid)[0].reason or "")
    teardown = world.service.steps.teardown_fn
    assert isinstance(teardown, ScriptTeardown) and teardown.calls == []


async def test_sibling_teardowns_all_run_before_the_single_deletion(
    world: World, flag: Path, base: Path
) -> None:
    # Two archived workspaces share one checkout directory (it carries A's marker).
    a, inc_a, path, ident = new_dir_ws(world, "shared")
    b, inc_b = ws_id("b"), secrets.token_hex(8)
    add_workspace(world.app, world.project_id, b, path, inc_b)
    log = base / "teardowns.log"
    # A's teardown succeeds; B's fails until the flag exists.
    world.service.steps.teardown_fn = ScriptTeardown(
        f'echo "$XUM_WORKSPACE_ID" >> {log}; '
        f'[ "$XUM_WORKSPACE_ID" = "{a}" ] || [ -f "$FLAG" ] || {{ echo no >&2; exit 1; }}'
    )
    world.plan(a, path, inc_a, ident)
    world.plan(b, path, inc_b, ident)
    # A partial retry (A only): A's teardown runs, but the deletion waits for B's teardown.
    status_a = await world.service.run_workspace(a, force=True)
    assert world.states(a)["teardown"] == "completed"
    assert status_a.status == "pending" and path.is_dir()
    status_b = await world.service.run_workspace(b, force=True)
    assert status_b.status == "pending" and status_b.attempts == 1
    assert world.states(b)["teardown"] == "pending", "a failing sibling is kept, never dropped"
    assert path.is_dir()
    flag.write_text("ok")
    world.clock.advance(10)
    for _ in range(4):
        await world.service.run_cycle("path")
        world.clock.advance(10)
    assert world.states(a)["trash"] == "completed"
    assert world.states(b)["teardown"] == "completed"
    assert world.states(b)["trash"] == "completed"
    assert not os.path.lexists(path)
    lines = log.read_text().split()
    assert lines.count(a) == 1 and lines.count(b) == 2
    # One deletion: exactly one of the two trash steps moved the directory.
    moved = [
        o.detail.get("moved")
        for w in (a, b)
        for o in world.service.obligations.for_workspace(w)
        if o.kind == "trash"
    ]
    assert sorted(moved) == [False, True]


async def test_trash_replay_after_crash_between_rename_and_commit(world: World, flag: Path) -> None:
    wid, inc, path, ident = new_dir_ws(world, "a")
    world.plan(wid, path, inc, ident, teardown=False)
    trash_ob = world.service.obligations.for_workspace(wid)[0]
    # The crash: the directory is in the trash, the completion was never committed.
    Path(trash_ob.detail["trash_path"]).parent.mkdir(parents=True)
    os.rename(path, trash_ob.detail["trash_path"])
    status = await world.service.run_workspace(wid, include_reclaim=True)
    assert status.status == "completed"
    assert world.service.obligations.for_workspace(wid)[0].detail["moved"] is True
    assert status.reclaim is not None and status.reclaim.status == "completed"
    assert not os.path.lexists(trash_ob.detail["trash_path"])


async def test_orphan_trash_is_adopted_and_reclaimed(world: World) -> None:
    orphan = world.root / "trash" / "ob_0000000000000000"
    orphan.mkdir(parents=True)
    (orphan / "left.txt").write_text("z" * 1000)
    world.service.housekeeping()
    pending = world.service.obligations.list(workspace_id="", state="pending", limit=10)
    assert [o.kind for o in pending] == ["reclaim"]
    await world.service.run_cycle("reclaim")
    assert not orphan.exists()
    done = world.service.obligations.get(pending[0].id)
    assert done is not None and done.state == "completed" and done.detail["bytes"] == 1000
    world.service.housekeeping()  # nothing new to adopt
    assert world.service.obligations.count("pending") == 0


async def test_a_pending_reclaims_entry_is_never_adopted_as_an_orphan(world: World) -> None:
    # The trash step is completed (the checkout is in the trash); its reclaim is still owed,
    # naming the entry only through `trash_ob`. The housekeeping at every start must not
    # adopt that entry as an orphan: two reclaims would race over one tree.
    wid, inc, path, ident = new_dir_ws(world, "a")
    world.plan(wid, path, inc, ident, teardown=False)
    status = await world.service.run_workspace(wid)
    assert status.status == "completed"
    steps = {o.kind: o for o in world.service.obligations.for_workspace(wid)}
    assert steps["trash"].state == "completed" and steps["reclaim"].state == PENDING
    entry = Path(steps["trash"].detail["trash_path"])
    assert entry.is_dir()
    world.service.housekeeping()
    assert world.service.obligations.list(workspace_id="", state=None, limit=10) == []
    assert entry in {Path(p) for p in world.service.obligations.referenced_trash_paths()}


async def test_unarchive_in_progress_makes_cleanup_wait_not_abandon(
    world: World, flag: Path
) -> None:
    flag.write_text("ok")
    wid, inc, path, ident = new_dir_ws(world, "a")
    world.plan(wid, path, inc, ident)
    # An unarchive committed its intent (new incarnation, restoring) and may still roll back.
    set_workspace(world.app, wid, incarnation=secrets.token_hex(8), state="restoring")
    status = await world.service.run_workspace(wid)
    assert status.status == "pending" and "waiting" in (status.last_error or "")
    assert path.is_dir()
    # It rolled back: the old incarnation is archived again; the cleanup proceeds.
    set_workspace(world.app, wid, incarnation=inc, state="archived")
    world.clock.advance(5)
    status = await world.service.run_workspace(wid)
    assert status.status == "completed" and not os.path.lexists(path)


async def test_teardown_without_a_script_runner_fails_closed(base: Path) -> None:
    # Cleanup gets the project's script runner from the composition root; built without one
    # (cleanup alone), its default teardown never pretends to have run: the step fails (and
    # blocks the deletion), it is neither done nor skipped.
    ob = ObligationRow.due_now(
        id="ob_" + secrets.token_hex(8),
        workspace_id="ws_" + secrets.token_hex(8),
        project_id="prj_" + secrets.token_hex(8),
        kind="teardown",
        seq=0,
        path=str(base),
        dev=None,
        ino=None,
        incarnation="x",
        detail={"setup_status": "untrusted"},
        now=0.0,
    )
    outcome = await ProjectTeardown(None)(ob, base)
    assert outcome.state == "failed"
    assert outcome.error == "no script runner is installed; teardown cannot run"
