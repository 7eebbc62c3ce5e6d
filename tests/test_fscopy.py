"""The copy primitive itself (xumd.lifecycle.fscopy), on real files: links are copied, never
followed; special files are never opened; holes stay; a failure part-way leaves nothing of the
copy behind (the failure is injected: a real one mid-copy cannot be timed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from xumd.errors import XumError
from xumd.lifecycle import fscopy, scripts


def _tree(top: Path) -> None:
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "f.txt").write_text("one\n")
    (top / "a" / "b" / "g.txt").write_text("two\n")
    (top / "a" / "exe").write_text("#!/bin/sh\n")
    (top / "a" / "exe").chmod(0o755)
    os.symlink("/etc", top / "a" / "out")
    os.mkfifo(top / "a" / "b" / "pipe")


def test_copy_tree_copies_links_as_links_and_skips_fifos(tmp_short: Path) -> None:
    src, dest = tmp_short / "src", tmp_short / "dest"
    src.mkdir()
    _tree(src)
    done = fscopy.copy_tree(src, dest)
    assert sorted(done.files) == ["a/b/g.txt", "a/exe", "a/f.txt", "a/out"]
    assert [(s.path, s.type) for s in done.special] == [("a/b/pipe", "fifo")]
    assert os.readlink(dest / "a" / "out") == "/etc"
    assert (dest / "a" / "b" / "g.txt").read_text() == "two\n"
    assert (dest / "a" / "exe").stat().st_mode & 0o777 == 0o755
    assert not os.path.lexists(dest / "a" / "b" / "pipe")


def test_copy_tree_removes_partial_output_on_failure(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dest = tmp_short / "src", tmp_short / "dest"
    src.mkdir()
    _tree(src)
    calls = {"n": 0}
    real = fscopy._copy_data

    def failing(s: int, d: int, size: int, between: object = None) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        real(s, d, size)

    monkeypatch.setattr(fscopy, "_copy_data", failing)
    with pytest.raises(OSError):
        fscopy.copy_tree(src, dest)
    assert not os.path.lexists(dest)


def test_merge_tree_removes_only_what_it_made(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dest = tmp_short / "src", tmp_short / "dest"
    src.mkdir()
    _tree(src)
    dest.mkdir()
    (dest / ".marker").write_text("mine\n")
    monkeypatch.setattr(fscopy, "_copy_data", _raise)
    with pytest.raises(OSError):
        fscopy.merge_tree(src, dest)
    assert sorted(os.listdir(dest)) == [".marker"]


def _raise(s: int, d: int, size: int, between: object = None) -> None:
    raise OSError(5, "Input/output error")


def test_copy_file_never_opens_a_fifo_and_keeps_holes(tmp_short: Path) -> None:
    os.mkfifo(tmp_short / "pipe")
    assert fscopy.copy_file(tmp_short / "pipe", tmp_short / "pipe2") == "fifo"
    assert not os.path.lexists(tmp_short / "pipe2")
    sparse = tmp_short / "sparse"
    with sparse.open("wb") as out:
        out.truncate(64 << 20)
        out.write(b"head")
    assert fscopy.copy_file(sparse, tmp_short / "copy") is None
    copy = tmp_short / "copy"
    assert copy.stat().st_size == 64 << 20
    assert copy.stat().st_blocks * 512 < 1 << 20
    assert copy.read_bytes()[:4] == b"head"


def test_check_space_refuses_with_the_numbers(tmp_short: Path) -> None:
    vfs = os.statvfs(tmp_short)
    free = vfs.f_bavail * vfs.f_frsize
    with pytest.raises(XumError) as info:
        fscopy.check_space(tmp_short, free + 1, 1, "a test tree")
    assert info.value.kind == "disk_full"
    assert info.value.data["needed_bytes"] == free + 1
    assert "a test tree" in info.value.message
    fscopy.check_space(tmp_short, 0, 1, "nothing")


def test_load_config_never_blocks_on_a_fifo_nor_reads_without_bound(tmp_short: Path) -> None:
    """`.xum/config.toml` is the user's file: a FIFO there (swapped in after `config_file`
    looked) must not block the daemon, and a huge file must not be read whole."""
    fifo = tmp_short / "config.toml"
    os.mkfifo(fifo)
    done: list[BaseException | None] = []

    def load() -> None:
        try:
            scripts.load_config(fifo)
            done.append(None)
        except BaseException as exc:
            done.append(exc)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=5)
    if worker.is_alive():
        # Unblock the reader (old behaviour) so the thread ends, then fail.
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(timeout=5)
        pytest.fail("load_config blocked on a FIFO")
    assert isinstance(done[0], OSError), done
    big = tmp_short / "big.toml"
    big.write_bytes(b"#" * (scripts.MAX_CONFIG_BYTES + 1))
    with pytest.raises(OSError, match="larger than"):
        scripts.load_config(big)
    ok = tmp_short / "ok.toml"
    ok.write_text('[scripts]\nsetup = ["true"]\n')
    assert scripts.load_config(ok).setup == ["true"]


@pytest.fixture
def xfs_reflink(tmp_short: Path) -> Iterator[Path]:
    """A real XFS with reflinks, loop-mounted from an image file (skips where not possible)."""
    if os.geteuid() != 0:
        pytest.skip("loop-mounting a filesystem needs root")
    if shutil.which("mkfs.xfs") is None:
        pytest.skip("mkfs.xfs is not installed (xfsprogs)")
    image, mount = tmp_short / "xfs.img", tmp_short / "xfs"
    with image.open("wb") as out:
        out.truncate(400 << 20)
    made = subprocess.run(
        ["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], capture_output=True, text=True
    )
    if made.returncode != 0:
        pytest.skip(f"mkfs.xfs failed: {made.stderr.strip()}")
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-o", "loop", str(image), str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot loop-mount here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)


def _free(path: Path) -> int:
    vfs = os.statvfs(path)
    return vfs.f_bavail * vfs.f_frsize


def test_copies_are_reflink_clones_where_the_filesystem_has_them(xfs_reflink: Path) -> None:
    """On XFS with reflinks a copy shares the source's extents (FICLONE; copy_file_range also
    clones there): 64 MiB of data is copied, as a file and inside a tree, and the free space
    does not move. A plain read/write copy (what shutil does) fails this."""
    src = xfs_reflink / "src"
    src.mkdir()
    data = os.urandom(64 << 20)
    (src / "big.bin").write_bytes(data)
    os.sync()
    before = _free(xfs_reflink)
    assert fscopy.copy_file(src / "big.bin", xfs_reflink / "one.bin") is None
    fscopy.copy_tree(src, xfs_reflink / "tree")
    os.sync()
    assert before - _free(xfs_reflink) < 1 << 20, "the copies took space: not clones"
    assert (xfs_reflink / "one.bin").read_bytes() == data
    assert (xfs_reflink / "tree" / "big.bin").read_bytes() == data
