"""Each cleanup guard tested where it is the only guard (issue 17): a real Store, real directories
and real git worktrees (tests/test_cleanup_support.py). Every test here was seen to fail with its
guard disabled; a set-up where a second check would also catch the case does not test the first.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from xumd import faults
from xumd.cleanup.steps import HOLD_BEFORE_RENAME
from xumd.lifecycle.marker import Marker, write_directory_marker

from tests.support.daemon import short_tmpdir
from tests.support.gitrepo import git
from tests.test_cleanup_support import (
    ScriptTeardown,
    World,
    add_workspace,
    make_dir_checkout,
    make_worktree,
    make_world,
    set_workspace,
    ws_id,
)

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


def teardown_calls(world: World) -> list[str]:
    fn = world.service.steps.teardown_fn
    assert isinstance(fn, ScriptTeardown)
    return fn.calls


@contextmanager
def immutable(directory: Path) -> Iterator[None]:
    """`chattr +i` on `directory`: nothing can be renamed out of it, not even by root (a real
    EPERM from the kernel). Always undone, also when the test fails."""
    done = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot make {directory} immutable here (needs root, ext4): {done.stderr}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


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
    wid, inc = ws_id("wt"), secrets.token_hex(8)
    path = world.root / "workspaces" / "wt"
    ident = make_worktree(world.repo, path, wid, inc)
    add_workspace(world.app, world.project_id, wid, path, inc)
    world.plan(wid, path, inc, ident, runtime="worktree", teardown=False)
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
