"""The trash area in a hostile world (docs/RELIABILITY.md, "Class: the trash area moved under
the reclaim"). Real daemon, real git, real tmpfs and bind mounts (root only; skipped with the
reason elsewhere), real SIGKILL.

- the root's trash area is a filesystem of its own: checkouts are trashed next to themselves
  and reclaimed there;
- a filesystem mounted over the trash area after the move hides the entry: the reclaim stays
  pending naming the mount (it used to say `completed`, freeing nothing), and completes once
  it is unmounted;
- a reclaim cut by SIGKILL half-way through its tree resumes after the restart, and one whose
  half-deleted entry gained a mount meanwhile waits for it, never descending.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import make_repo
from tests.support.holds import hold_env, release, wait_held
from tests.support.lifecycle_helpers import add_project, create
from tests.support.mounts import Mounts, mounts_under, real_mounts
from tests.support.platform import PORTABLE
from tests.support.wait import until

FAST = (
    "[cleanup]\nbackoff_initial_s = 0.1\nbackoff_max_s = 0.3\nbackoff_jitter = 0.1\n"
    "poll_interval_s = 0.2\n"
)
RECLAIM_HOLD = "cleanup.reclaim.hold"
WALK_HOLD = "cleanup.reclaim.hold_walk"


@pytest.fixture
def mounts(tmp_short: Path) -> Iterator[Mounts]:
    with real_mounts(tmp_short) as m:
        yield m


def _daemon(root: Path, **kwargs: Any) -> DaemonProcess:
    write_config(root, FAST)
    return DaemonProcess(root, **kwargs).start()


def _cleanup(daemon: DaemonProcess, wid: str) -> dict[str, dict[str, Any]]:
    obs = daemon.call("cleanup.list", {"workspace_id": wid})["obligations"]
    return {o["kind"]: o for o in obs}


def _removed(daemon: DaemonProcess, tmp_short: Path, files: int = 3) -> dict[str, Any]:
    """A workspace with a build tree, removed: its path is free, its reclaim is owed."""
    project = add_project(daemon, make_repo(tmp_short / "repo"))
    ws: dict[str, Any] = create(daemon, project["id"], "w")["workspace"]
    build = Path(ws["path"]) / "build"
    for d in range(files):
        (build / f"d{d}").mkdir(parents=True)
        for f in range(files):
            (build / f"d{d}" / f"f{f}.o").write_bytes(b"o" * 8192)
    removed = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    assert removed["cleanup"]["status"] == "completed", removed["cleanup"]
    return ws


@pytest.mark.parametrize("kind", ["tmpfs", "bind"])
def test_a_trash_area_on_its_own_filesystem_trashes_next_to_the_checkout(
    root: Path, tmp_short: Path, mounts: Mounts, kind: str
) -> None:
    """ROOT/trash is a tmpfs (a user gave the trash its own disk), or a bind mount of the same
    filesystem (same st_dev, another mount): a rename from the checkout into it would fail with
    EXDEV, so the checkout goes to `.xum-trash` next to itself and is reclaimed there; the
    trash area is left empty and mounted."""
    daemon = _daemon(root)
    try:
        (root / "trash").mkdir(exist_ok=True)
        if kind == "bind":
            backing = tmp_short / "backing"
            backing.mkdir()
            mounts.bind(backing, root / "trash")
        else:
            mounts.tmpfs(root / "trash", size="4m")
        ws = _removed(daemon, tmp_short)
        checkout = Path(ws["path"])
        assert not checkout.exists()
        reclaim = until(
            lambda: (r := _cleanup(daemon, ws["id"])["reclaim"])["state"] == "completed" and r,
            message="the reclaim next to the checkout",
        )
        assert reclaim["bytes"] >= 9 * 8192, reclaim
        trash = _cleanup(daemon, ws["id"])["trash"]
        assert Path(trash["detail"]["trash_path"]).parent == checkout.parent / ".xum-trash"
        assert list((checkout.parent / ".xum-trash").iterdir()) == []
        assert list((root / "trash").iterdir()) == []
        assert str(root / "trash") in mounts_under(tmp_short)
    finally:
        daemon.close()


def test_a_mount_over_the_trash_area_keeps_the_reclaim_pending_not_falsely_done(
    root: Path, tmp_short: Path, mounts: Mounts
) -> None:
    """The checkout was moved into ROOT/trash; then a filesystem is mounted over ROOT/trash.
    The entry is hidden, not gone: the reclaim must not say `completed` (the space is still
    used, and once unmounted nothing would ever reclaim it before the hourly orphan look). It
    stays pending naming the mount, and completes, freeing the bytes, once it is unmounted."""
    holds = tmp_short / "holds"
    daemon = _daemon(root, env=hold_env(RECLAIM_HOLD, holds))
    try:
        ws = _removed(daemon, tmp_short)
        wait_held(RECLAIM_HOLD, holds)
        entry = Path(_cleanup(daemon, ws["id"])["trash"]["detail"]["trash_path"])
        assert entry.parent == root / "trash" and entry.is_dir()
        point = mounts.tmpfs(root / "trash", size="1m")
        assert not entry.exists()  # hidden under the mount
        release(RECLAIM_HOLD, holds)

        def waits() -> dict[str, Any] | None:
            ob = _cleanup(daemon, ws["id"])["reclaim"]
            return ob if ob["state"] != "pending" or ob["last_error"] else None

        ob = until(waits, message="the reclaim's first attempt")
        assert ob["state"] == "pending", ob
        assert f"mount at {point}" in ob["last_error"], ob
        mounts.unmount(point)
        assert entry.is_dir()

        def done() -> bool:
            if (holds / f"{RECLAIM_HOLD}.held").exists():
                release(RECLAIM_HOLD, holds)
            return _cleanup(daemon, ws["id"])["reclaim"]["state"] == "completed"

        until(done, message="the reclaim once unmounted")
        assert not entry.exists()
        assert _cleanup(daemon, ws["id"])["reclaim"]["bytes"] >= 9 * 8192
    finally:
        daemon.close()


def _half_delete(entry: Path) -> None:
    """What a walk cut by SIGKILL leaves: some leaves and one whole subdirectory gone (fsdelete
    removes bottom-up, the top directory last, so its identity is intact)."""
    build = entry / "build"
    shutil.rmtree(build / "d0")
    (build / "d1" / "f0.o").unlink()


def _killed_half_way(daemon: DaemonProcess, tmp_short: Path) -> tuple[dict[str, Any], Path]:
    """A removed workspace whose reclaim is held at its walk, the daemon SIGKILLed there, and
    the entry left as a cut walk leaves it. Returns the workspace and its trash entry."""
    ws = _removed(daemon, tmp_short)
    wait_held(WALK_HOLD, tmp_short / "holds")
    entry = Path(_cleanup(daemon, ws["id"])["trash"]["detail"]["trash_path"])
    daemon.kill()
    _half_delete(entry)
    return ws, entry


def test_a_reclaim_killed_half_way_resumes_after_the_restart(root: Path, tmp_short: Path) -> None:
    holds = tmp_short / "holds"
    daemon = _daemon(root, env=hold_env(WALK_HOLD, holds))
    try:
        ws, entry = _killed_half_way(daemon, tmp_short)
        daemon.env = {}
        daemon.start()
        reclaim = until(
            lambda: (r := _cleanup(daemon, ws["id"])["reclaim"])["state"] == "completed" and r,
            message="the resumed reclaim",
        )
        assert not entry.exists()
        assert reclaim["bytes"] > 0, str(reclaim)
        assert list((root / "trash").iterdir()) == []
        assert daemon.call("daemon.status")["details"]["cleanup"]["pending"] == 0
    finally:
        daemon.close()


def test_a_half_deleted_entry_that_gained_a_mount_is_never_descended(
    root: Path, tmp_short: Path, mounts: Mounts
) -> None:
    """Killed half-way; while the daemon is down something is bind-mounted into what is left
    of the entry. The resumed reclaim stays pending naming it, the mounted data intact; once
    unmounted it completes."""
    outside = tmp_short / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep\n")
    holds = tmp_short / "holds"
    daemon = _daemon(root, env=hold_env(WALK_HOLD, holds))
    try:
        ws, entry = _killed_half_way(daemon, tmp_short)
        point = mounts.bind(outside, entry / "build" / "d2")
        daemon.env = {}
        daemon.start()

        def waits() -> dict[str, Any] | None:
            ob = _cleanup(daemon, ws["id"])["reclaim"]
            return ob if ob["state"] != "pending" or ob["last_error"] else None

        ob = until(waits, message="the resumed reclaim's attempt")
        assert ob["state"] == "pending", ob
        assert f"mount at {point}" in ob["last_error"], ob
        assert (outside / "precious.txt").read_text() == "keep\n"
        assert sorted(os.listdir(outside)) == ["precious.txt"]
        mounts.unmount(point)
        until(
            lambda: _cleanup(daemon, ws["id"])["reclaim"]["state"] == "completed",
            message="the reclaim once unmounted",
        )
        assert not entry.exists()
        assert (outside / "precious.txt").read_text() == "keep\n"
    finally:
        daemon.close()


def test_a_missing_entry_is_gone_unless_a_live_mount_hides_it(tmp_short: Path) -> None:
    """trash_area's rule without a mount: the area on the mount it was recorded on, no record
    (an entry moved before the record existed), or a recorded mount that is no longer mounted
    at its point (unmounted, or renumbered by a reboot): the entry is gone, never waited for."""
    from xumd.cleanup import trash_area

    area = tmp_short / "area"
    area.mkdir()
    recorded = trash_area.area_mount(area)
    # Without mount ids (the portable backend) the record is the table's mount point alone.
    assert recorded is not None and (recorded[0] is None if PORTABLE else recorded[0] > 0)
    entry = area / "ob_0123456789abcdef"
    assert trash_area.hiding_mount(entry, recorded) is None
    assert trash_area.hiding_mount(entry, None) is None
    assert trash_area.hiding_mount(entry, [recorded[0], "/not/its/point"]) is None
    if not PORTABLE:
        assert trash_area.hiding_mount(entry, [10**9, recorded[1]]) is None
    # A recorded mount that still exists while the area now resolves to another one: hidden.
    other = trash_area.area_mount(Path("/proc"))
    assert other is not None and other != recorded
    assert trash_area.hiding_mount(entry, other) == recorded[1]


def _count(top: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(top))


@pytest.mark.reliability
def test_a_reclaim_killed_inside_its_walk_resumes_after_the_restart(
    root: Path, tmp_short: Path
) -> None:
    """The real thing: SIGKILL while the reclaim's worker is deleting (some files gone, the
    rest there), then a restart: the reclaim resumes on what is left and completes; the
    workspace's reclaim is the only one (no orphan adopted)."""
    holds = tmp_short / "holds"
    repo = make_repo(tmp_short / "repo", {"README.md": "hi\n", ".gitignore": "build/\n"})
    daemon = _daemon(root, env=hold_env(WALK_HOLD, holds))
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "big")["workspace"]
        build = Path(ws["path"]) / "build"
        for d in range(60):
            (build / f"d{d}").mkdir(parents=True)
            for f in range(250):
                (build / f"d{d}" / f"f{f}").write_bytes(b"x")
        removed = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
        assert removed["cleanup"]["status"] == "completed", removed["cleanup"]
        wait_held(WALK_HOLD, holds)
        entry = Path(_cleanup(daemon, ws["id"])["trash"]["detail"]["trash_path"])
        total = _count(entry)
        release(WALK_HOLD, holds)
        until(lambda: _count(entry) < total, interval=0.001, message="the walk to start")
        daemon.kill()
        left = _count(entry)
        assert 0 < left < total, (left, total)  # cut inside the walk
        daemon.env = {}
        daemon.start()
        until(
            lambda: _cleanup(daemon, ws["id"])["reclaim"]["state"] == "completed",
            message="the resumed reclaim",
        )
        assert not entry.exists()
        listed = daemon.call("cleanup.list", {"limit": 1000})["obligations"]
        assert [o for o in listed if o["workspace_id"] == ""] == [], "an orphan was adopted"
    finally:
        daemon.close()
