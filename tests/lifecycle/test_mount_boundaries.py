"""Filesystem boundaries: a mount inside a checkout is never emptied. Real daemon, real git, real
bind mounts and tmpfs (root only; skipped with the reason elsewhere).

- archive, remove {force} and rename refuse `busy` with a `mount` holder naming the mount point,
  for both runtimes, and change nothing;
- a mount that appears after the quiescence check (before the checkout moves) keeps the trash
  step pending, naming it; one that appears in the trash entry keeps the reclaim pending, naming
  it; neither is ever descended, and both complete once it is unmounted;
- a checkout on another mount of the same filesystem (same st_dev) is trashed next to itself.
"""

from __future__ import annotations

import errno
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import make_repo
from tests.support.holds import hold_env, release, wait_held
from tests.support.lifecycle_helpers import (
    add_project,
    commit_scripts,
    create,
    kept_env_copy,
    rpc_error,
    trusted_daemon,
)
from tests.support.mounts import Mounts, mounts_under, real_mounts
from tests.support.wait import until

FAST = (
    "[cleanup]\nbackoff_initial_s = 0.1\nbackoff_max_s = 0.3\nbackoff_jitter = 0.1\n"
    "poll_interval_s = 0.2\n"
)


@pytest.fixture
def mounts(tmp_short: Path) -> Iterator[Mounts]:
    with real_mounts(tmp_short) as m:
        yield m


@pytest.fixture
def outside(tmp_short: Path) -> Path:
    """A user's directory (a shared cache, a dataset) that gets bind-mounted into a checkout."""
    top = tmp_short / "outside"
    (top / "sub").mkdir(parents=True)
    (top / "data.txt").write_text("precious\n")
    (top / "sub" / "more.txt").write_text("more\n")
    return top


def _tree(top: Path) -> list[tuple[str, str]]:
    return sorted(
        (str(p.relative_to(top)), p.read_text() if p.is_file() else "<dir>") for p in top.rglob("*")
    )


OUTSIDE_TREE = [("data.txt", "precious\n"), ("sub", "<dir>"), ("sub/more.txt", "more\n")]


def _start(root: Path, **kwargs: Any) -> DaemonProcess:
    write_config(root, FAST)
    return DaemonProcess(root, **kwargs).start()


@pytest.fixture
def fast(root: Path) -> Iterator[DaemonProcess]:
    proc = _start(root)
    yield proc
    proc.close()


def _workspace(daemon: DaemonProcess, tmp_short: Path, runtime: str) -> dict[str, Any]:
    if runtime == "worktree":
        project = add_project(daemon, make_repo(tmp_short / "repo"))
        ws: dict[str, Any] = create(daemon, project["id"], "w")["workspace"]
    else:
        plain = tmp_short / "plain"
        plain.mkdir()
        project = add_project(daemon, plain)
        ws = create(daemon, project["id"], "w", runtime="directory")["workspace"]
    return ws


def _assert_busy_on_mount(err: Any, point: Path) -> None:
    assert err.kind == "busy"
    assert {"kind": "mount", "pid": None, "label": f"mount at {point}", "since": None} in err.data[
        "holders"
    ]
    assert f"mount at {point}" in err.message


def _state(daemon: DaemonProcess, wid: str) -> str:
    return str(daemon.call("workspace.get", {"workspace_id": wid})["workspace"]["state"])


@pytest.mark.parametrize("runtime", ["worktree", "directory"])
def test_structural_operations_refuse_busy_naming_a_mount(
    fast: DaemonProcess, tmp_short: Path, mounts: Mounts, outside: Path, runtime: str
) -> None:
    ws = _workspace(fast, tmp_short, runtime)
    checkout = Path(ws["path"])
    (checkout / "mnt").mkdir()
    point = mounts.bind(outside, checkout / "mnt")
    for method, params in (
        ("workspace.archive", {}),
        ("workspace.archive", {"stop": True}),
        ("workspace.remove", {"force": True}),
        ("workspace.rename", {"name": "renamed"}),
    ):
        err = rpc_error(fast, method, {"workspace_id": ws["id"], **params})
        _assert_busy_on_mount(err, point)
        assert _state(fast, ws["id"]) == "active"
        assert _tree(outside) == OUTSIDE_TREE
        assert checkout.is_dir()
    listed = fast.call("process.holders", {"workspace_id": ws["id"]})
    assert listed["holders"] == [
        {
            "kind": "mount",
            "pid": None,
            "label": f"mount at {point}",
            "since": None,
            "process_id": None,  # a mount is no process of the daemon's
            "command": None,
        }
    ]
    # Unmounted: the same calls go through, and the user's directory is intact.
    mounts.unmount(point)
    archived = fast.call("workspace.archive", {"workspace_id": ws["id"]})
    assert archived["cleanup"]["status"] == "completed"
    assert not checkout.exists()
    assert _tree(outside) == OUTSIDE_TREE


def test_a_mount_on_the_checkout_itself_and_a_tmpfs_inside(
    fast: DaemonProcess, tmp_short: Path, mounts: Mounts
) -> None:
    ws = _workspace(fast, tmp_short, "directory")
    checkout = Path(ws["path"])
    (checkout / "cache").mkdir()
    inner = mounts.tmpfs(checkout / "cache")
    (inner / "blob").write_text("on the tmpfs\n")
    err = rpc_error(fast, "workspace.remove", {"workspace_id": ws["id"], "force": True})
    _assert_busy_on_mount(err, inner)
    mounts.unmount(inner)
    # A mount over the whole checkout (the marker is hidden under it: the daemon no longer
    # sees its checkout there, and still refuses rather than deleting the mount's files).
    over = mounts.tmpfs(checkout)
    (over / "user.txt").write_text("mine\n")
    err = rpc_error(fast, "workspace.remove", {"workspace_id": ws["id"], "force": True})
    _assert_busy_on_mount(err, over)
    assert (over / "user.txt").read_text() == "mine\n"


def _releasing(holds: Path, point: str, condition: Callable[[], bool]) -> Callable[[], bool]:
    """A condition for `until` that lets every arrival held at `point` through meanwhile."""

    def check() -> bool:
        if (holds / f"{point}.held").exists():
            release(point, holds)
        return condition()

    return check


def _trash_entry(daemon: DaemonProcess, root: Path, wid: str) -> Path:
    obs = daemon.call("cleanup.list", {"workspace_id": wid})["obligations"]
    trash = next(o for o in obs if o["kind"] == "trash")
    return root / "trash" / trash["id"]


def _cleanup(daemon: DaemonProcess, wid: str) -> dict[str, dict[str, Any]]:
    obs = daemon.call("cleanup.list", {"workspace_id": wid})["obligations"]
    return {o["kind"]: o for o in obs}


@pytest.mark.parametrize("point_name", ["cleanup.reclaim.hold", "cleanup.reclaim.hold_walk"])
def test_a_mount_in_the_trash_entry_keeps_the_reclaim_pending(
    root: Path, tmp_short: Path, mounts: Mounts, outside: Path, point_name: str
) -> None:
    """A bind mount appears in the trash entry before the reclaim's checks (found in the mount
    table: nothing is deleted), or after them, just before the walk (the walk stops at it).
    Either way the reclaim stays pending naming it and the mounted directory is intact."""
    holds = tmp_short / "holds"
    daemon = _start(root, env=hold_env(point_name, holds))
    try:
        ws = _workspace(daemon, tmp_short, "worktree")
        checkout = Path(ws["path"])
        (checkout / "build").mkdir()
        (checkout / "build" / "out.o").write_text("obj\n")
        archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        assert archived["cleanup"]["status"] == "completed"  # the path is free
        assert not checkout.exists()
        wait_held(point_name, holds)
        entry = _trash_entry(daemon, root, ws["id"])
        assert (entry / "build" / "out.o").exists()
        point = mounts.bind(outside, entry / "build")
        release(point_name, holds)

        def reclaim_waits() -> dict[str, Any] | None:
            ob = _cleanup(daemon, ws["id"]).get("reclaim")
            return ob if ob and ob["attempts"] >= 1 and ob["last_error"] else None

        ob = until(reclaim_waits, message="the reclaim to fail on the mount")
        assert ob["state"] == "pending"
        assert f"at {point} inside trash entry {entry}" in ob["last_error"]
        assert "not descended" in ob["last_error"]
        assert _tree(outside) == OUTSIDE_TREE
        # Retries keep failing on it (let a few through): the mount still untouched.
        attempts = ob["attempts"]
        until(
            _releasing(
                holds,
                point_name,
                lambda: _cleanup(daemon, ws["id"])["reclaim"]["attempts"] >= attempts + 2,
            ),
            message="two more reclaim attempts",
        )
        assert _tree(outside) == OUTSIDE_TREE
        assert _cleanup(daemon, ws["id"])["reclaim"]["state"] == "pending"
        # Unmounted: a next attempt completes, and the user's directory is intact.
        mounts.unmount(point)
        until(
            _releasing(
                holds,
                point_name,
                lambda: _cleanup(daemon, ws["id"])["reclaim"]["state"] == "completed",
            ),
            message="the reclaim to complete",
        )
        assert not entry.exists()
        assert _tree(outside) == OUTSIDE_TREE
    finally:
        daemon.close()


def test_a_mount_over_the_trash_entry_keeps_the_reclaim_pending(
    root: Path, tmp_short: Path, mounts: Mounts
) -> None:
    holds = tmp_short / "holds"
    point_name = "cleanup.reclaim.hold"
    daemon = _start(root, env=hold_env(point_name, holds))
    try:
        ws = _workspace(daemon, tmp_short, "directory")
        daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        wait_held(point_name, holds)
        entry = _trash_entry(daemon, root, ws["id"])
        over = mounts.tmpfs(entry)
        (over / "theirs.txt").write_text("someone else's\n")
        release(point_name, holds)
        ob = until(
            lambda: (r := _cleanup(daemon, ws["id"])["reclaim"])["last_error"] and r,
            message="the reclaim to fail on the mount",
        )
        assert ob["state"] == "pending"
        assert f"mount at {entry}" in ob["last_error"]
        assert (over / "theirs.txt").read_text() == "someone else's\n"
    finally:
        daemon.close()


@pytest.mark.parametrize("where", ["inside", "over"])
def test_a_mount_appearing_before_the_move_keeps_the_trash_step_pending(
    root: Path, tmp_short: Path, mounts: Mounts, outside: Path, where: str
) -> None:
    """Archive's quiescence check passed; a mount appears before the trash step moves the
    checkout, inside it or over the whole checkout (hiding its marker: the fence used to call
    it foreign and abandon the step for good): the step waits (pending, naming it), the
    checkout stays, the mount untouched; once unmounted, a retry moves and reclaims it."""
    holds = tmp_short / "holds"
    point_name = "cleanup.trash.hold"
    daemon = _start(root, env=hold_env(point_name, holds))
    try:
        ws = _workspace(daemon, tmp_short, "worktree")
        checkout = Path(ws["path"])
        (checkout / "mnt").mkdir()
        answer: dict[str, Any] = {}

        def archive() -> None:
            answer.update(daemon.call("workspace.archive", {"workspace_id": ws["id"]}))

        caller = threading.Thread(target=archive)
        caller.start()
        wait_held(point_name, holds)
        point = mounts.bind(outside, checkout / "mnt" if where == "inside" else checkout)
        release(point_name, holds)
        caller.join(timeout=30)
        assert not caller.is_alive()
        cleanup = answer["cleanup"]
        assert cleanup["status"] == "pending"
        assert f"mount at {point}" in cleanup["last_error"]
        assert checkout.is_dir()
        assert _tree(outside) == OUTSIDE_TREE
        assert _state(daemon, ws["id"]) == "archived"
        # Unarchive first settles the lingering checkout: a mount in it (or over it) is `busy`
        # naming it (its files are not unsaved work); nothing of the mount is touched.
        refused: list[Any] = []
        caller = threading.Thread(
            target=lambda: refused.append(
                rpc_error(daemon, "workspace.unarchive", {"workspace_id": ws["id"]})
            )
        )
        caller.start()
        until(_releasing(holds, point_name, lambda: bool(refused)), message="unarchive refused")
        caller.join(timeout=30)
        _assert_busy_on_mount(refused[0], point)
        assert _tree(outside) == OUTSIDE_TREE
        assert _state(daemon, ws["id"]) == "archived"
        # Unmounted: a retry moves the checkout and reclaims it; the user's files survive.
        mounts.unmount(point)
        until(
            _releasing(
                holds,
                point_name,
                lambda: all(o["state"] == "completed" for o in _cleanup(daemon, ws["id"]).values()),
            ),
            message="the trash and reclaim steps to complete",
        )
        assert not checkout.exists()
        assert _tree(outside) == OUTSIDE_TREE
    finally:
        daemon.close()


@pytest.mark.parametrize("kind", ["bind", "tmpfs"])
def test_checkout_on_another_mount_is_trashed_and_reclaimed_next_to_it(
    fast: DaemonProcess, tmp_short: Path, mounts: Mounts, kind: str
) -> None:
    """The project's workspaces directory is another mount: a tmpfs, or a bind mount of the
    root's own filesystem (same st_dev: only the mount differs). A rename into ROOT/trash would
    fail with EXDEV, so the trash goes next to the checkout (`.xum-trash`), and its reclaim
    deletes the entry there (it used to look for it in ROOT/trash)."""
    spaces = tmp_short / "spaces"
    backing = tmp_short / "backing"
    spaces.mkdir()
    backing.mkdir()
    if kind == "bind":
        mounts.bind(backing, spaces)
    else:
        mounts.tmpfs(spaces, size="16m")
    project = add_project(fast, make_repo(tmp_short / "repo"), workspaces_dir=str(spaces))
    ws = create(fast, project["id"], "w")["workspace"]
    checkout = Path(ws["path"])
    assert checkout.parent == spaces
    archived = fast.call("workspace.archive", {"workspace_id": ws["id"]})
    assert archived["cleanup"]["status"] == "completed", archived["cleanup"]
    assert not checkout.exists()
    reclaim = until(
        lambda: (r := _cleanup(fast, ws["id"])["reclaim"])["state"] == "completed" and r,
        message="the reclaim to complete",
    )
    assert reclaim["bytes"] > 0
    assert list((spaces / ".xum-trash").iterdir()) == []
    assert mounts_under(tmp_short) == [str(spaces)]


def test_no_inode_left_for_the_trash_area_keeps_the_trash_step_pending(
    fast: DaemonProcess, tmp_short: Path, mounts: Mounts
) -> None:
    """ENOSPC in the trash step: the checkout's filesystem (a tmpfs, so the trash goes next to
    it) has no inode left for `.xum-trash`. The step stays pending naming the error, the
    checkout stays in place and intact; once space is freed a retry moves and reclaims it."""
    spaces = tmp_short / "spaces"
    spaces.mkdir()
    mounts.tmpfs(spaces, size="16m", options="nr_inodes=200")
    project = add_project(fast, make_repo(tmp_short / "repo"), workspaces_dir=str(spaces))
    ws = create(fast, project["id"], "w")["workspace"]
    checkout = Path(ws["path"])
    (checkout / "notes.txt").write_text("unsaved\n")
    filler = spaces / "filler"
    filler.mkdir()
    for i in range(1000):
        try:
            (filler / str(i)).touch()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
            break
    else:
        pytest.fail("the tmpfs never ran out of inodes")
    archived = fast.call("workspace.archive", {"workspace_id": ws["id"]})
    assert archived["workspace"]["state"] == "archived"
    assert archived["snapshot"] is not None  # the work is saved before anything moves
    cleanup = archived["cleanup"]
    assert cleanup["status"] == "pending"
    assert "No space left on device" in cleanup["last_error"]
    assert (checkout / "notes.txt").read_text() == "unsaved\n"
    for entry in filler.iterdir():
        entry.unlink()
    until(
        lambda: all(o["state"] == "completed" for o in _cleanup(fast, ws["id"]).values()),
        message="the trash and reclaim steps to complete",
    )
    assert not checkout.exists()
    assert list((spaces / ".xum-trash").iterdir()) == []


def test_a_hard_link_out_of_the_checkout_keeps_its_data(
    fast: DaemonProcess, tmp_short: Path
) -> None:
    """A file in the checkout hard-linked to one outside: the reclaim unlinks the checkout's
    name only (the outside file keeps its bytes), and does not count those bytes as freed."""
    ws = _workspace(fast, tmp_short, "directory")
    checkout = Path(ws["path"])
    big = tmp_short / "dataset.bin"
    big.write_bytes(b"\1" * 1_000_000)
    os.link(big, checkout / "dataset.bin")
    (checkout / "small.txt").write_text("x" * 10)
    fast.call("workspace.archive", {"workspace_id": ws["id"]})
    reclaim = until(
        lambda: (r := _cleanup(fast, ws["id"])["reclaim"])["state"] == "completed" and r,
        message="the reclaim to complete",
    )
    assert big.read_bytes() == b"\1" * 1_000_000
    assert big.stat().st_nlink == 1
    assert 10 <= reclaim["bytes"] < 1_000_000


def test_a_mount_over_the_checkout_keeps_the_teardown_waiting(
    root: Path, tmp_short: Path, ctl: Path, mounts: Mounts, outside: Path
) -> None:
    """A failing teardown bind-mounts over its own checkout (after archive's quiescence check):
    the retry's fence no longer finds the marker, which used to abandon the teardown for good
    (never run again). Now it waits naming the mount; once unmounted it runs and the checkout
    goes, the mounted directory intact."""
    repo = make_repo(tmp_short / "repo")
    commit_scripts(
        repo,
        teardown=f'if [ -f {ctl}/ok ]; then exit 0; fi; mount --bind {outside} "$PWD"; exit 3',
    )
    mounts.require()  # the script mounts; unmounted at the end like the test's own mounts
    with trusted_daemon(root, repo, FAST) as (daemon, project):
        ws = create(daemon, project["id"], "w")["workspace"]
        checkout = Path(ws["path"])
        archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        assert archived["cleanup"]["status"] == "pending"
        assert mounts_under(tmp_short) == [str(checkout)]

        def waits() -> dict[str, Any] | None:
            ob = _cleanup(daemon, ws["id"])["teardown"]
            return ob if "over the checkout" in (ob["last_error"] or "") else None

        ob = until(waits, message="the teardown to wait on the mount")
        assert ob["state"] == "pending"
        assert f"mount at {checkout}" in ob["last_error"]
        (ctl / "ok").touch()
        subprocess.run(["umount", str(checkout)], check=True)
        until(
            lambda: all(o["state"] == "completed" for o in _cleanup(daemon, ws["id"]).values()),
            message="teardown, trash and reclaim to complete",
        )
        assert not checkout.exists()
        assert _tree(outside) == OUTSIDE_TREE


def test_discard_kept_never_empties_a_mount_in_the_kept_copy(
    fast: DaemonProcess, tmp_short: Path, mounts: Mounts, outside: Path
) -> None:
    """`workspace.discard_kept` deletes a kept copy of preserved files (ROOT/archive/<ws>): a
    mount inside it is `busy` naming it (nothing deleted); after the unmount it goes."""
    kept = kept_env_copy(fast, tmp_short)
    (kept / "files" / "cache").mkdir()
    point = mounts.bind(outside, kept / "files" / "cache")
    err = rpc_error(fast, "workspace.discard_kept", {"path": str(kept)})
    _assert_busy_on_mount(err, point)
    assert (kept / "files" / ".env").read_text() == "KEY=1\n"
    assert _tree(outside) == OUTSIDE_TREE
    mounts.unmount(point)
    assert fast.call("workspace.discard_kept", {"path": str(kept)})["path"] == str(kept)
    assert not kept.exists()
    assert _tree(outside) == OUTSIDE_TREE
