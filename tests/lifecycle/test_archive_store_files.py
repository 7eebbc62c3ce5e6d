"""Special and sparse files in the archive store (docs/RELIABILITY.md), with a real
daemon, real named pipes, sockets and device nodes, real sparse files and real small tmpfs
mounts: a special file is never opened (skipped, reported in `dropped.special` with its type,
the operation goes on), holes stay holes both ways, a copy that does not fit is refused
`disk_full` before anything is written, and no partial copy is left behind."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project, create, rpc_error
from tests.support.tmpfs import tmpfs
from tests.support.wait import until


@pytest.fixture
def small_root(tmp_short: Path) -> Iterator[Path]:
    """A daemon root (so the archive store) on a 24 MiB tmpfs: a copy that never ends (a
    device read) or does not fit stops there, not on the machine's disk."""
    with tmpfs(tmp_short / "root", "size=24m") as root:
        yield root


@pytest.fixture
def small_daemon(small_root: Path) -> Iterator[DaemonProcess]:
    write_config(small_root, "")
    proc = DaemonProcess(small_root).start()
    try:
        yield proc
    finally:
        proc.close()


def _specials(where: Path, *, device: bool) -> dict[str, str]:
    """A named pipe, a bound Unix socket file and (as root) /dev/zero's device node."""
    (where / "run").mkdir(parents=True, exist_ok=True)
    os.mkfifo(where / "run" / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(where / "run" / "s.sock"))
    sock.close()
    made = {"run/pipe": "fifo", "run/s.sock": "socket"}
    if device:
        os.mknod(where / "zero", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
        made["zero"] = "char_device"
    return made


def _special_of(result: dict[str, Any]) -> dict[str, str]:
    return {s["path"]: s["type"] for s in result["dropped"]["special"]}


def _leftovers(root: Path) -> list[str]:
    store = root / "archive"
    return sorted(n for n in os.listdir(store) if n.startswith(".")) if store.is_dir() else []


def test_directory_archive_skips_special_files(
    small_daemon: DaemonProcess, small_root: Path, tmp_short: Path
) -> None:
    plain = tmp_short / "plain"
    plain.mkdir()
    project = add_project(small_daemon, plain)
    ws = create(small_daemon, project["id"], "d", runtime="directory")["workspace"]
    path = Path(ws["path"])
    (path / "notes.txt").write_text("kept\n")
    made = _specials(path, device=os.geteuid() == 0)

    archived = small_daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert archived["workspace"]["state"] == "archived"
    assert _special_of(archived) == made
    assert archived["dropped"]["preserved"] == ["notes.txt"]
    assert _leftovers(small_root) == []
    # Only the regular file is in the store (the device was never read).
    content = small_root / "archive" / ws["id"] / "content"
    assert sorted(str(p.relative_to(content)) for p in content.rglob("*")) == [
        "notes.txt",
        "run",
    ]

    back = small_daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert back["workspace"]["state"] == "active"
    assert (path / "notes.txt").read_text() == "kept\n"

    # Remove (force) saves a copy too: the same special files again, and the row goes.
    _specials(path, device=False)
    removed = small_daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    assert removed["removed"] is True
    assert _special_of(removed) == {"run/pipe": "fifo", "run/s.sock": "socket"}
    assert _leftovers(small_root) == []


def test_worktree_archive_reports_special_files(daemon: DaemonProcess, tmp_short: Path) -> None:
    repo = make_repo(tmp_short / "repo", {"README.md": "x\n", ".gitignore": "cache/\n"})
    project = add_project(daemon, repo)
    ws = create(daemon, project["id"], "w")["workspace"]
    path = Path(ws["path"])
    made = _specials(path, device=os.geteuid() == 0)
    (path / "cache").mkdir()
    os.mkfifo(path / "cache" / "ignored-pipe")
    made["cache/ignored-pipe"] = "fifo"

    archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert archived["workspace"]["state"] == "archived"
    assert _special_of(archived) == made
    back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert back["workspace"]["state"] == "active"

    os.mkfifo(path / "again")
    removed = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    assert _special_of(removed) == {"again": "fifo"}


def _allocated(path: Path) -> int:
    return path.stat().st_blocks * 512


def test_directory_archive_keeps_holes(daemon: DaemonProcess, tmp_short: Path, root: Path) -> None:
    plain = tmp_short / "plain"
    plain.mkdir()
    project = add_project(daemon, plain)
    ws = create(daemon, project["id"], "s", runtime="directory")["workspace"]
    path = Path(ws["path"])
    big = path / "disk.img"
    size = 512 << 20
    with big.open("wb") as out:
        out.truncate(size)
        out.seek(100 << 20)
        out.write(b"data in the middle")
    assert _allocated(big) < 1 << 20

    archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert archived["workspace"]["state"] == "archived"
    stored = root / "archive" / ws["id"] / "content" / "disk.img"
    assert stored.stat().st_size == size
    assert _allocated(stored) < 1 << 20, "the archive copy filled the holes"

    daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert big.stat().st_size == size
    assert _allocated(big) < 1 << 20, "the restored file came back fully allocated"
    with big.open("rb") as f:
        f.seek(100 << 20)
        assert f.read(18) == b"data in the middle"


def test_directory_archive_refuses_disk_full(
    small_daemon: DaemonProcess, small_root: Path, tmp_short: Path
) -> None:
    """The checkout is on the big disk (project.add workspaces_dir); the archive store on a
    24 MiB tmpfs: 32 MiB of real data cannot fit. Refused before writing, row still active."""
    plain = tmp_short / "plain"
    plain.mkdir()
    outside = tmp_short / "checkouts"
    outside.mkdir()
    project = add_project(small_daemon, plain, workspaces_dir=str(outside))
    ws = create(small_daemon, project["id"], "big", runtime="directory")["workspace"]
    path = Path(ws["path"])
    data = os.urandom(1 << 20)
    with (path / "blob.bin").open("wb") as out:
        for _ in range(32):
            out.write(data)
    free_before = os.statvfs(small_root).f_bavail

    err = rpc_error(small_daemon, "workspace.archive", {"workspace_id": ws["id"]})
    assert err.kind == "disk_full", err
    assert err.code == -32017
    assert err.data["needed_bytes"] >= 32 << 20
    assert err.data["available_bytes"] < err.data["needed_bytes"]
    assert str(32 << 20) in err.message or "bytes" in err.message
    got = small_daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert got["state"] == "active" and not got["interrupted"]
    assert (path / "blob.bin").stat().st_size == 32 << 20
    assert _leftovers(small_root) == []
    assert not (small_root / "archive" / ws["id"]).exists()
    # Nothing was written: the free space is what it was (give or take the store's journal).
    assert os.statvfs(small_root).f_bavail >= free_before - 64

    # Once it fits, the same archive goes through.
    (path / "blob.bin").write_bytes(b"small now\n")
    archived = small_daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert archived["workspace"]["state"] == "archived"


def test_directory_remove_disk_full_leaves_no_stuck_row(
    small_daemon: DaemonProcess, small_root: Path, tmp_short: Path
) -> None:
    """remove --force copies a directory checkout into the archive store after `removing` is
    committed: when that copy does not fit, the row is not left `removing` (every later call
    would be `invalid_state`): nothing was deleted before the removal's commit, so the removal
    rolls itself back (`active`, not flagged) and a later remove works."""
    plain = tmp_short / "plain"
    plain.mkdir()
    outside = tmp_short / "checkouts"
    outside.mkdir()
    project = add_project(small_daemon, plain, workspaces_dir=str(outside))
    ws = create(small_daemon, project["id"], "big", runtime="directory")["workspace"]
    path = Path(ws["path"])
    (path / "blob.bin").write_bytes(os.urandom(32 << 20))

    err = rpc_error(small_daemon, "workspace.remove", {"workspace_id": ws["id"], "force": True})
    assert err.kind == "disk_full", err
    got = small_daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert got["state"] == "active" and not got["interrupted"], got
    assert (path / "blob.bin").stat().st_size == 32 << 20
    assert _leftovers(small_root) == []
    (path / "blob.bin").unlink()
    removed = small_daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    assert removed["removed"] is True


@pytest.fixture
def small_checkouts(tmp_short: Path) -> Iterator[Path]:
    with tmpfs(tmp_short / "small", "size=24m") as where:
        yield where


def test_directory_unarchive_refuses_disk_full(
    daemon: DaemonProcess, tmp_short: Path, small_checkouts: Path
) -> None:
    """The checkouts live on a 24 MiB tmpfs: after the archive, the tmpfs is filled so that
    the 8 MiB archived content cannot come back. Unarchive refuses `disk_full` before copying,
    the row is `archived` again (not `restoring`), nothing is left on the tmpfs; once there is
    room, the same unarchive restores the bytes."""
    plain = tmp_short / "plain"
    plain.mkdir()
    project = add_project(daemon, plain, workspaces_dir=str(small_checkouts))
    ws = create(daemon, project["id"], "d", runtime="directory")["workspace"]
    path = Path(ws["path"])
    data = os.urandom(8 << 20)
    (path / "blob.bin").write_bytes(data)
    archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert archived["cleanup"]["status"] == "completed"
    until(
        lambda: not daemon.call("cleanup.list", {"state": "pending"})["obligations"],
        message="the reclaim of the archived checkout",
    )
    filler = small_checkouts / "filler"
    vfs = os.statvfs(small_checkouts)
    free = vfs.f_bavail * vfs.f_frsize
    with filler.open("wb") as out:
        out.write(b"\0" * (free - (4 << 20)))  # leave 4 MiB: less than the 8 MiB to restore
    before = sorted(os.listdir(small_checkouts))

    err = rpc_error(daemon, "workspace.unarchive", {"workspace_id": ws["id"]})
    assert err.kind == "disk_full", err
    got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert got["state"] == "archived" and not got["interrupted"], got
    assert sorted(os.listdir(small_checkouts)) == before
    assert not os.path.lexists(path)

    filler.unlink()
    back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert back["workspace"]["state"] == "active"
    assert (path / "blob.bin").read_bytes() == data
