"""Each cleanup guard tested where it is the only guard: a real Store, real directories
and real git worktrees (tests/cleanup/test_support.py). Every test here was seen to fail with its
guard disabled; a set-up where a second check would also catch the case does not test the first.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from xumd.base import faults
from xumd.checkouts.marker import Marker, write_directory_marker
from xumd.cleanup.steps import HOLD_BEFORE_RENAME

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
from tests.support.fsattr import immutable
from tests.support.gitrepo import git
from tests.support.tmpfs import tmpfs

OK_TEARDOWN = "echo torn down"


@pytest.fixture
def base() -> Iterator[Path]:
    path = short_tmpdir("xumg-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def world(base: Path) -> World:
    return make_world(base, ScriptTeardown(OK_TEARDOWN), backoff_initial_s=1.0)


def dir_ws(world: World, name: str) -> tuple[str, str, Path, tuple[int, int]]:
    wid, inc = ws_id(name), secrets.token_hex(8)
    path = world.root / "workspaces" / name
    ident = make_dir_checkout(path, wid, inc)
    add_workspace(world.app, world.project_id, wid, path, inc)
    return wid, inc, path, ident


def worktree_ws(world: World) -> tuple[str, str, Path, tuple[int, int]]:
    """A worktree workspace `wt` (its admin entry: `.git/worktrees/wt`)."""
    wid, inc = ws_id("wt"), secrets.token_hex(8)
    path = world.root / "workspaces" / "wt"
    ident = make_worktree(world.repo, path, wid, inc)
    add_workspace(world.app, world.project_id, wid, path, inc)
    return wid, inc, path, ident


def planned_worktree(world: World) -> tuple[str, Path]:
    """`worktree_ws`, its removal planned (no teardown)."""
    wid, inc, path, ident = worktree_ws(world)
    world.plan(wid, path, inc, ident, runtime="worktree", teardown=False)
    return wid, path


def teardown_calls(world: World) -> list[str]:
    fn = world.service.steps.teardown_fn
    assert isinstance(fn, ScriptTeardown)
    return fn.calls


# -- no false success --------------------------------------------------------------------------


async def test_a_move_the_kernel_refuses_stays_pending(world: World) -> None:
    """The trash rename raises OSError (EPERM: the parent is immutable): the step is failed and
    retried, never recorded done while the checkout is still at its path."""
    wid, inc, path, ident = dir_ws(world, "a")
    world.plan(wid, path, inc, ident, teardown=False)
    with immutable(path.parent):
        status = await world.service.run_workspace(wid)
        assert status.status == "pending", status
        assert "Operation not permitted" in (status.last_error or ""), status
        assert path.is_dir() and os.stat(path).st_ino == ident[1]
        trash = world.service.obligations.for_workspace(wid)[0]
        assert trash.kind == "trash" and trash.state == "pending"
    world.clock.advance(10)
    status = await world.service.run_workspace(wid)
    assert status.status == "completed", status
    assert not os.path.lexists(path)
    trash = world.service.obligations.for_workspace(wid)[0]
    assert trash.detail.get("moved") is True and "note" not in trash.detail, trash.detail
    # The trash area the step made is private to the daemon's user.
    assert stat.S_IMODE(os.stat(world.root / "trash").st_mode) == 0o700


# -- no successor harm: each fence check alone ------------------------------------------------


async def test_directory_swapped_in_during_the_move_is_put_back(
    world: World, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the fence and the rename (a held point), the checkout is swapped for a copy with
    the same marker: the fence already passed, so only the identity check after the move can see
    it. The copy goes back to the path; nothing is recorded as moved."""
    wid, inc, path, ident = dir_ws(world, "a")
    world.plan(wid, path, inc, ident, teardown=False)
    holds = base / "holds"
    holds.mkdir()
    monkeypatch.setenv(faults.HOLD_DIR_VAR, str(holds))
    monkeypatch.setattr(faults, "_armed", HOLD_BEFORE_RENAME.name)
    held = holds / f"{HOLD_BEFORE_RENAME.name}.held"
    found = {}

    async def run() -> None:
        found["status"] = await world.service.run_workspace(wid)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        with anyio.fail_after(20):
            while not held.exists():
                await anyio.sleep(0.01)
        copy = base / "copy"
        shutil.copytree(path, copy, symlinks=True)
        os.rename(path, base / "original")
        os.rename(copy, path)
        copy_ino = os.stat(path).st_ino
        (holds / f"{HOLD_BEFORE_RENAME.name}.release").touch()
    status = found["status"]
    assert status.status != "completed", status
    assert os.stat(path).st_ino == copy_ino, "the swapped-in directory was not put back"
    assert (base / "original" / "f0.txt").exists()
    trash = world.service.obligations.for_workspace(wid)[0]
    assert trash.state == "abandoned" and "swapped during the move" in (trash.reason or "")
    assert not os.path.lexists(trash.detail["trash_path"])


async def test_stale_incarnation_is_refused_while_the_row_is_archived_again(world: World) -> None:
    """The row names a newer incarnation and is archived again (an own state, so the state check
    passes); the directory is the recorded one (same inode) and carries the newer marker, which a
    sibling obligation accepts. Only the incarnation check stops the older obligations: the old
    incarnation's teardown never runs, the newer incarnation's steps do (planned without a
    teardown of their own, so any teardown run is the stale one)."""
    wid, old, path, ident = dir_ws(world, "a")
    world.plan(wid, path, old, ident)
    new = secrets.token_hex(8)
    write_directory_marker(path, Marker(wid, new))
    set_workspace(world.app, wid, incarnation=new, state="archived")
    world.plan(wid, path, new, ident, teardown=False)
    assert os.stat(path).st_ino == ident[1]
    await world.service.run_workspace(wid, include_reclaim=True)
    by_inc: dict[str, dict[str, str]] = {}
    for ob in world.service.obligations.for_workspace(wid):
        by_inc.setdefault(ob.incarnation, {})[ob.kind] = ob.state
        if ob.incarnation == old and ob.kind != "reclaim":
            # Final (the row is not passing through creating/restoring): no state suffix.
            assert (ob.reason or "").endswith(f"{wid} was materialised again)"), ob
    assert by_inc[old] == {"teardown": "abandoned", "trash": "abandoned", "reclaim": "abandoned"}
    assert by_inc[new] == {"trash": "completed", "reclaim": "completed"}
    assert teardown_calls(world) == []
    assert not os.path.lexists(path)


async def test_marker_of_another_workspace_in_the_recorded_directory(world: World) -> None:
    """The very directory recorded (same inode: no reuse involved), the row unchanged, but its
    marker now names another workspace: only the marker check refuses it."""
    wid, inc, path, ident = dir_ws(world, "a")
    world.plan(wid, path, inc, ident)
    other, other_inc = ws_id("b"), secrets.token_hex(8)
    write_directory_marker(path, Marker(other, other_inc))
    (path / "theirs.txt").write_text("another workspace's work")
    assert (os.stat(path).st_dev, os.stat(path).st_ino) == ident
    status = await world.service.run_workspace(wid, include_reclaim=True)
    assert status.status == "failed", status
    assert (path / "theirs.txt").read_text() == "another workspace's work"
    assert teardown_calls(world) == []
    first = world.service.obligations.for_workspace(wid)[0]
    assert first.state == "abandoned" and f"marker names {other}" in (first.reason or "")


async def test_admin_entry_locked_for_another_workspace_is_left_alone(world: World) -> None:
    """A stale trash step whose checkout is gone would drop git's admin entry it recorded; the
    entry of that name now belongs to another workspace's worktree (its lock reason names that
    workspace): it is left alone and the other worktree keeps working."""
    wid, path = planned_worktree(world)
    admin = world.repo / ".git" / "worktrees" / "wt"
    # The user deleted the checkout and pruned its entry by hand...
    git(world.repo, "worktree", "unlock", str(path))
    shutil.rmtree(path)
    git(world.repo, "worktree", "prune")
    assert not admin.exists()
    # ...and another workspace's worktree (same basename) was given the same entry name.
    other, other_inc = ws_id("b"), secrets.token_hex(8)
    other_path = world.root / "elsewhere" / "wt"
    make_worktree(world.repo, other_path, other, other_inc)
    add_workspace(world.app, world.project_id, other, other_path, other_inc, state="active")
    assert (admin / "locked").read_text().split()[1] == other
    status = await world.service.run_workspace(wid)
    assert status.status == "completed", status  # its own checkout is gone: nothing else to do
    assert (admin / "locked").read_text().split()[1] == other
    assert str(other_path) in git(world.repo, "worktree", "list")
    git(other_path, "status", "--short")  # still a working checkout
    trash = world.service.obligations.for_workspace(wid)[0]
    assert trash.detail.get("admin_entry") == "left alone (names another worktree)", trash.detail


async def test_a_file_at_the_path_is_not_a_checkout_gone(world: World) -> None:
    """A regular file now sits at the checkout's path: the path is not free, so the step is
    abandoned (never "already gone", never completed) and the file is left alone."""
    wid, inc, path, ident = dir_ws(world, "a")
    world.plan(wid, path, inc, ident, teardown=False)
    shutil.rmtree(path)
    path.write_text("someone's file")
    status = await world.service.run_workspace(wid, include_reclaim=True)
    assert status.status == "failed", status
    assert path.read_text() == "someone's file"
    trash = world.service.obligations.for_workspace(wid)[0]
    assert trash.state == "abandoned" and "not a directory" in (trash.reason or ""), trash


async def test_a_path_that_cannot_be_inspected_is_left_alone(world: World, base: Path) -> None:
    """`lstat` fails with something other than "no such file" (ENOTDIR: the parent directory was
    moved away and a file put in its place): nothing is proven gone, so the steps are abandoned
    with the error, never completed as "already gone"."""
    wid, inc, path, ident = dir_ws(world, "a")
    world.plan(wid, path, inc, ident, teardown=False)
    os.rename(path.parent, base / "moved-away")
    path.parent.write_text("a file where the directory was")
    status = await world.service.run_workspace(wid, include_reclaim=True)
    assert status.status == "failed", status
    trash = world.service.obligations.for_workspace(wid)[0]
    assert trash.state == "abandoned" and "cannot inspect" in (trash.reason or ""), trash
    assert (base / "moved-away" / "a" / "f0.txt").exists()


async def test_the_recorded_directory_without_a_marker_is_left_alone(world: World) -> None:
    """The recorded directory (same inode), its marker deleted: nothing proves it is still the
    checkout, and it is certainly not gone. Abandoned, the directory untouched."""
    wid, inc, path, ident = dir_ws(world, "a")
    world.plan(wid, path, inc, ident, teardown=False)
    (path / ".xum-incarnation").unlink()
    status = await world.service.run_workspace(wid, include_reclaim=True)
    assert status.status == "failed", status
    assert (os.stat(path).st_dev, os.stat(path).st_ino) == ident
    assert (path / "f0.txt").exists()
    trash = world.service.obligations.for_workspace(wid)[0]
    assert trash.state == "abandoned" and "no xum incarnation marker" in (trash.reason or "")


# -- always live: a blocked step is deferred, never due again at once ---------------------------


async def test_a_step_blocked_by_a_due_sibling_teardown_waits_a_backoff(world: World) -> None:
    """A's deletion waits for B's teardown of the same directory, which is itself due now. A's
    step is deferred at least the initial backoff: never left due at once (which would make every
    cycle pick it again and spin while the sibling's teardown is owed)."""
    a, inc_a, path, ident = dir_ws(world, "shared")
    b, inc_b = ws_id("b"), secrets.token_hex(8)
    add_workspace(world.app, world.project_id, b, path, inc_b)
    world.plan(a, path, inc_a, ident, teardown=False)
    world.plan(b, path, inc_b, ident)
    now = world.clock.time()
    status = await world.service.run_workspace(a)
    assert status.status == "pending" and path.is_dir(), status
    (trash,) = [o for o in world.service.obligations.for_workspace(a) if o.kind == "trash"]
    assert trash.attempts == 0
    assert trash.next_attempt_at >= now + world.service.config.backoff_initial_s, trash
    assert teardown_calls(world) == []
    # B's teardown finishes: A's deletion is due at once (the clock has not moved), not a
    # backoff later; the next path cycle deletes the directory.
    await world.service.run_workspace(b)
    assert world.states(b)["teardown"] == "completed"
    (trash,) = [o for o in world.service.obligations.for_workspace(a) if o.kind == "trash"]
    assert trash.next_attempt_at <= world.clock.time(), trash
    await world.service.run_cycle("path")
    assert world.states(a)["trash"] == "completed" or world.states(b)["trash"] == "completed"
    assert not os.path.lexists(path)


async def test_reclaim_waits_for_its_trash_step_a_backoff(world: World) -> None:
    """The reclaim lane meets a plan whose trash step (path lane) is pending and due: the reclaim
    does not run before the move it reclaims, and is deferred at least the initial backoff (not
    left due, to be picked again by every reclaim cycle)."""
    wid, inc, path, ident = dir_ws(world, "a")
    world.plan(wid, path, inc, ident, teardown=False)
    now = world.clock.time()
    cycle = await world.service.run_cycle("reclaim")
    assert cycle.attempted == [], "nothing ran: the lane must not count it (it would spin)"
    trash, reclaim = world.service.obligations.for_workspace(wid)
    assert (trash.kind, trash.state, trash.attempts) == ("trash", "pending", 0)
    assert (reclaim.kind, reclaim.state, reclaim.attempts) == ("reclaim", "pending", 0)
    assert reclaim.next_attempt_at >= now + world.service.config.backoff_initial_s, reclaim
    assert path.is_dir()
    # Then the path lane moves it, and the reclaim deletes what was moved.
    status = await world.service.run_workspace(wid)
    assert status.status == "completed"
    world.clock.advance(10)
    await world.service.run_cycle("reclaim")
    (_, reclaim) = world.service.obligations.for_workspace(wid)
    assert reclaim.state == "completed" and reclaim.detail.get("bytes", 0) > 0, reclaim


async def test_an_unlocked_admin_entry_pointing_at_our_path_is_dropped(world: World) -> None:
    """The user unlocked the worktree and deleted the checkout (no lock reason is left to prove
    the entry ours): the entry is still ours when its `gitdir` names our path, now empty. It is
    dropped, and git has nothing left to prune."""
    wid, path = planned_worktree(world)
    git(world.repo, "worktree", "unlock", str(path))
    shutil.rmtree(path)
    admin = world.repo / ".git" / "worktrees" / "wt"
    assert admin.is_dir() and not (admin / "locked").exists()
    status = await world.service.run_workspace(wid)
    assert status.status == "completed", status
    trash = world.service.obligations.for_workspace(wid)[0]
    assert trash.detail.get("admin_entry") == "dropped", trash.detail
    assert not admin.exists()
    assert git(world.repo, "worktree", "prune", "--dry-run", "-v").strip() == ""


async def test_a_checkout_already_gone_reclaims_nothing(world: World) -> None:
    """The checkout vanished before the move: the trash step completes saying so, and the
    reclaim completes with nothing to free (0 bytes, not needed)."""
    wid, inc, path, ident = dir_ws(world, "a")
    world.plan(wid, path, inc, ident, teardown=False)
    shutil.rmtree(path)
    status = await world.service.run_workspace(wid, include_reclaim=True)
    assert status.status == "completed", status
    trash, reclaim = world.service.obligations.for_workspace(wid)
    assert trash.detail.get("moved") is False, trash.detail
    assert trash.detail.get("note") == "the checkout was already gone", trash.detail
    assert reclaim.state == "completed", reclaim
    assert (reclaim.detail.get("bytes"), reclaim.detail.get("needed")) == (0, False), reclaim
    assert status.reclaim is not None and status.reclaim.bytes == 0


async def test_a_trash_entry_already_deleted_completes_the_reclaim(world: World) -> None:
    """The replay after a crash between the deletion and its commit: the trash entry is gone,
    so the reclaim completes (nothing left to free), never fails on the missing entry."""
    wid, inc, path, ident = dir_ws(world, "a")
    world.plan(wid, path, inc, ident, teardown=False)
    status = await world.service.run_workspace(wid)
    assert status.status == "completed", status
    trash, reclaim = world.service.obligations.for_workspace(wid)
    shutil.rmtree(trash.detail["trash_path"])
    await world.service.run_cycle("reclaim")
    (_, reclaim) = world.service.obligations.for_workspace(wid)
    assert reclaim.state == "completed" and reclaim.attempts <= 1, reclaim
    assert reclaim.detail.get("bytes") == 0, reclaim.detail


async def test_a_checkout_on_another_filesystem_goes_to_a_private_trash_beside_it(
    world: World,
) -> None:
    """A rename cannot cross filesystems: the checkout moves into `.xum-trash` next to it, a
    directory only the daemon's user may enter (0700, like ROOT/trash), and is reclaimed there."""
    mount = world.root / "workspaces" / "other-fs"
    with tmpfs(mount, "size=8m"):
        wid, inc = ws_id("x"), secrets.token_hex(8)
        path = mount / "x"
        ident = make_dir_checkout(path, wid, inc)
        add_workspace(world.app, world.project_id, wid, path, inc)
        assert os.stat(path).st_dev != os.stat(world.root).st_dev
        world.plan(wid, path, inc, ident, teardown=False)
        status = await world.service.run_workspace(wid)
        assert status.status == "completed", status
        moved_to = mount / ".xum-trash" / world.service.obligations.for_workspace(wid)[0].id
        assert moved_to.is_dir() and not os.path.lexists(path)
        assert stat.S_IMODE(os.stat(moved_to.parent).st_mode) == 0o700
        # The completed step records where the checkout went: its reclaim deletes that entry.
        trash = world.service.obligations.for_workspace(wid)[0]
        assert trash.detail["trash_path"] == str(moved_to), trash.detail
        await world.service.run_cycle("reclaim")
        (_, reclaim) = world.service.obligations.for_workspace(wid)
        assert reclaim.state == "completed", reclaim
        assert not os.path.lexists(moved_to), "the moved checkout was never reclaimed"
        assert (reclaim.detail.get("bytes") or 0) >= 300, reclaim
        # A second checkout there: the trash beside it already exists, and is used again.
        wid2, inc2 = ws_id("y"), secrets.token_hex(8)
        ident2 = make_dir_checkout(mount / "y", wid2, inc2)
        add_workspace(world.app, world.project_id, wid2, mount / "y", inc2)
        world.plan(wid2, mount / "y", inc2, ident2, teardown=False)
        status = await world.service.run_workspace(wid2)
        assert status.status == "completed", status
        assert not os.path.lexists(mount / "y")


async def test_a_failing_teardown_is_retried_only_after_its_backoff(world: World) -> None:
    """A teardown that fails is pending with its error (what failed, then the output's tail);
    asked again before its backoff ran out (no `force`), it is not attempted again."""
    world.service.steps.teardown_fn = ScriptTeardown("echo 'db still in use' >&2; exit 3")
    wid, inc, path, ident = dir_ws(world, "a")
    world.plan(wid, path, inc, ident)
    status = await world.service.run_workspace(wid)
    assert status.status == "pending" and status.attempts == 1, status
    lines = (status.last_error or "").splitlines()
    assert lines[0] == "/bin/sh exited with 3" and "db still in use" in lines[-1], lines
    status = await world.service.run_workspace(wid)  # before the backoff: not attempted
    assert status.status == "pending" and status.attempts == 1, status
    assert teardown_calls(world) == [wid]
    world.clock.advance(10)
    status = await world.service.run_workspace(wid)
    assert status.attempts == 2 and teardown_calls(world) == [wid, wid], status
    assert path.is_dir()


async def test_an_admin_entry_already_pruned_completes_the_step(world: World) -> None:
    """The user deleted the checkout and git pruned its admin entry: nothing is left to drop, and
    the step completes saying so (it does not fail on the missing entry)."""
    wid, path = planned_worktree(world)
    git(world.repo, "worktree", "unlock", str(path))
    shutil.rmtree(path)
    git(world.repo, "worktree", "prune")
    status = await world.service.run_workspace(wid)
    assert status.status == "completed", status
    trash = world.service.obligations.for_workspace(wid)[0]
    assert trash.detail.get("admin_entry") == "already gone", trash.detail


async def test_a_worktree_without_a_recorded_admin_entry_is_still_trashed(world: World) -> None:
    """A worktree checkout whose `.git` file was gone when the removal was planned: no admin
    entry is known, so none is touched ("unknown"), and the checkout still goes."""
    wid, inc, path, ident = dir_ws(world, "a")
    world.plan(wid, path, inc, ident, runtime="worktree", teardown=False)
    status = await world.service.run_workspace(wid)
    assert status.status == "completed", status
    trash = world.service.obligations.for_workspace(wid)[0]
    assert trash.detail.get("admin_entry") == "unknown", trash.detail


async def test_an_admin_entry_with_nothing_to_prove_it_ours_is_left_alone(world: World) -> None:
    """The recorded admin entry has neither a lock reason nor a `gitdir` (damaged, or someone
    else's): nothing proves it ours, so it stays."""
    wid, path = planned_worktree(world)
    admin = world.repo / ".git" / "worktrees" / "wt"
    shutil.rmtree(path)
    (admin / "locked").unlink()
    (admin / "gitdir").unlink()
    status = await world.service.run_workspace(wid)
    assert status.status == "completed", status
    assert admin.is_dir()
    trash = world.service.obligations.for_workspace(wid)[0]
    assert trash.detail.get("admin_entry") == "left alone (names another worktree)", trash.detail


async def test_admin_files_that_are_fifos_are_never_waited_on(world: World) -> None:
    """The recorded admin entry's `locked` and `gitdir` replaced by named pipes (a hostile
    repository): reading them must not block (a plain open waits for a writer, in the event
    loop's thread: the whole daemon). Unreadable, they prove nothing: the entry stays."""
    wid, path = planned_worktree(world)
    admin = world.repo / ".git" / "worktrees" / "wt"
    shutil.rmtree(path)
    for name in ("locked", "gitdir"):
        (admin / name).unlink()
        os.mkfifo(admin / name)
    status = await world.service.run_workspace(wid)
    assert status.status == "completed", status
    assert stat.S_ISFIFO(os.lstat(admin / "locked").st_mode)
    trash = world.service.obligations.for_workspace(wid)[0]
    assert trash.detail.get("admin_entry") == "left alone (names another worktree)", trash.detail


async def test_a_foreign_directory_at_the_trash_path_is_not_taken_for_ours(
    world: World, base: Path
) -> None:
    """The checkout is gone and some other directory sits at the step's trash path: the replay
    rule (a directory there is the one we moved) holds only for the recorded identity. Nothing
    counts as moved, and the reclaim does not delete that directory."""
    wid, inc, path, ident = dir_ws(world, "a")
    world.plan(wid, path, inc, ident, teardown=False)
    trash_path = Path(world.service.obligations.for_workspace(wid)[0].detail["trash_path"])
    # The checkout is moved away, not deleted: its inode stays taken, so the directory made at
    # the trash path cannot get its number back (ext4 reuses freed inode numbers at once).
    os.rename(path, base / "aside")
    trash_path.mkdir(parents=True)
    (trash_path / "keep.txt").write_text("not the checkout")
    status = await world.service.run_workspace(wid, include_reclaim=True)
    assert status.status == "completed", status
    trash, reclaim = world.service.obligations.for_workspace(wid)
    assert trash.detail.get("moved") is False, trash.detail
    assert reclaim.state == "completed" and reclaim.detail.get("needed") is False, reclaim
    assert (trash_path / "keep.txt").read_text() == "not the checkout"


async def test_reclaim_never_deletes_a_directory_swapped_into_the_trash(
    world: World, base: Path
) -> None:
    """After the move, the trash entry is replaced by another directory: the reclaim checks the
    identity it recorded and abandons, leaving that directory alone."""
    wid, inc, path, ident = dir_ws(world, "a")
    world.plan(wid, path, inc, ident, teardown=False)
    status = await world.service.run_workspace(wid)
    assert status.status == "completed", status
    trash_path = Path(world.service.obligations.for_workspace(wid)[0].detail["trash_path"])
    # Moved aside, not deleted: its inode stays taken, so the new one cannot reuse it.
    os.rename(trash_path, base / "aside")
    trash_path.mkdir()
    (trash_path / "keep.txt").write_text("someone else's")
    await world.service.run_cycle("reclaim")
    (_, reclaim) = world.service.obligations.for_workspace(wid)
    assert reclaim.state == "abandoned" and "not the directory moved there" in (
        reclaim.reason or ""
    ), reclaim
    assert (trash_path / "keep.txt").read_text() == "someone else's"


async def test_the_trash_path_beside_a_checkout_is_committed_before_the_move(
    world: World, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Durable order across filesystems: where the checkout will go (`.xum-trash` beside it) is in
    the obligation's row before the rename (seen at the held point just before it), so a replay
    after a crash between the move and its commit finds the entry it moved."""
    mount = world.root / "workspaces" / "other-fs"
    with tmpfs(mount, "size=8m"):
        wid, inc = ws_id("x"), secrets.token_hex(8)
        path = mount / "x"
        ident = make_dir_checkout(path, wid, inc)
        add_workspace(world.app, world.project_id, wid, path, inc)
        world.plan(wid, path, inc, ident, teardown=False)
        holds = base / "holds"
        holds.mkdir()
        monkeypatch.setenv(faults.HOLD_DIR_VAR, str(holds))
        monkeypatch.setattr(faults, "_armed", HOLD_BEFORE_RENAME.name)
        held = holds / f"{HOLD_BEFORE_RENAME.name}.held"
        async with anyio.create_task_group() as tg:
            tg.start_soon(world.service.run_workspace, wid)
            with anyio.fail_after(20):
                while not held.exists():
                    await anyio.sleep(0.01)
            row = world.service.obligations.for_workspace(wid)[0]
            (holds / f"{HOLD_BEFORE_RENAME.name}.release").touch()
        assert row.detail["trash_path"] == str(mount / ".xum-trash" / row.id), row.detail
        assert not os.path.lexists(path)


async def test_a_mount_inside_the_checkout_keeps_the_trash_step_waiting(world: World) -> None:
    """A filesystem mounted inside the checkout would ride along into the trash (and its
    reclaim would stop at it): the step waits, naming the mount, the checkout and the mount
    untouched; once unmounted, a retry moves the checkout."""
    wid, inc, path, ident = dir_ws(world, "m")
    world.plan(wid, path, inc, ident, teardown=False)
    with tmpfs(path / "mnt", "size=1m") as mnt:
        (mnt / "theirs").write_text("on the mount\n")
        status = await world.service.run_workspace(wid)
        assert status.status == "pending", status
        assert f"mount at {mnt}" in (status.last_error or ""), status
        assert path.is_dir() and (mnt / "theirs").read_text() == "on the mount\n"
    world.clock.advance(10)
    status = await world.service.run_workspace(wid)
    assert status.status == "completed", status
    assert not os.path.lexists(path)


def test_an_unsaved_wait_names_ten_files_then_counts_the_rest() -> None:
    from xumd.cleanup.steps import UNSAVED_SHOWN, _unsaved_wait

    few = [f"f{i}" for i in range(3)]
    assert "f0, f1, f2;" in _unsaved_wait(Path("/co"), few)
    assert " more" not in _unsaved_wait(Path("/co"), few)
    assert UNSAVED_SHOWN == 10  # (a literal: the module's constant is what is tested)
    ten = [f"f{i}" for i in range(10)]
    assert "f8, f9;" in _unsaved_wait(Path("/co"), ten)
    assert " more" not in _unsaved_wait(Path("/co"), ten)
    many = [f"f{i}" for i in range(12)]
    text = _unsaved_wait(Path("/co"), many)
    assert "f9 and 2 more;" in text and "f10" not in text


def test_the_cleanup_holds_are_test_points_never_crash_points() -> None:
    # A hold only parks a step for a test; the crash matrix must not kill the daemon there.
    from xumd.cleanup import steps

    holds = (steps.TRASH_HOLD, steps.RECLAIM_HOLD, steps.RECLAIM_WALK_HOLD)
    assert all(point.simulate for point in holds)
    assert not {point.name for point in holds} & set(faults.all_points())


# -- the last four survivors of steps.py's mutation run --------------------------------------


async def test_a_mount_over_the_checkout_itself_makes_the_teardown_wait(world: World) -> None:
    """A tmpfs mounted over the checkout hides its marker: the fence cannot prove the directory
    ours, but the checkout is still there under the mount. The teardown waits (failed, retried,
    naming the mount), never abandons the workspace's teardown as if the directory were foreign."""
    wid, inc, path, ident = dir_ws(world, "a")
    world.plan(wid, path, inc, ident, teardown=True)
    with tmpfs(path):
        status = await world.service.run_workspace(wid)
        teardown = world.service.obligations.for_workspace(wid)[0]
        assert teardown.kind == "teardown", teardown
        assert teardown.state == "pending", teardown
        assert f"waiting: mount at {path} over the checkout" in (teardown.last_error or "")
        assert status.status == "pending", status
        assert teardown_calls(world) == []
    assert os.stat(path).st_ino == ident[1]  # the checkout itself was never touched


async def test_an_unlocked_admin_entry_naming_another_missing_path_is_left_alone(
    world: World,
) -> None:
    """The recorded admin entry, unlocked, now names another checkout path that does not exist
    (another workspace's worktree, its disk unmounted): a `gitdir` proves the entry ours only when
    it names OUR path; a missing target alone is not proof. Left alone."""
    wid, path = planned_worktree(world)
    git(world.repo, "worktree", "unlock", str(path))
    shutil.rmtree(path)
    admin = world.repo / ".git" / "worktrees" / "wt"
    (admin / "gitdir").write_text(str(world.root / "elsewhere" / "wt" / ".git") + "\n")
    status = await world.service.run_workspace(wid)
    assert status.status == "completed", status
    assert admin.is_dir() and (admin / "gitdir").is_file()
    trash = world.service.obligations.for_workspace(wid)[0]
    assert trash.detail.get("admin_entry") == "left alone (names another worktree)", trash.detail


async def test_an_admin_entry_outside_a_worktrees_directory_is_left_alone(world: World) -> None:
    """The checkout's `.git` file named a directory that is not under git's `worktrees/` (a
    hand-edited or hostile `.git` file): even though its `gitdir` names our path, it is not a
    worktree admin entry, so the step never deletes it."""
    wid, inc, path, ident = worktree_ws(world)
    decoy = world.root / "someones" / "wt"
    decoy.mkdir(parents=True)
    (decoy / "gitdir").write_text(str(path / ".git") + "\n")
    (decoy / "keep").write_text("not git's")
    (path / ".git").write_text(f"gitdir: {decoy}\n")
    world.plan(wid, path, inc, ident, runtime="worktree", teardown=False)
    shutil.rmtree(path)
    status = await world.service.run_workspace(wid)
    assert status.status == "completed", status
    assert (decoy / "keep").read_text() == "not git's"
    trash = world.service.obligations.for_workspace(wid)[0]
    assert trash.detail.get("admin_entry") == "left alone (not a worktree admin dir)", trash.detail
