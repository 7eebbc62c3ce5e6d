"""The copy primitive itself (xumd.system.fscopy), on real files: links are copied, never
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
from xumd.base.errors import XumError
from xumd.lifecycle import scripts
from xumd.system import fscopy

from tests.support.platform import BACKEND


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


def test_special_type_names_every_kind_that_is_never_opened(tmp_short: Path) -> None:
    """Real special files (a bound socket, device nodes made with mknod as root) and the three
    kinds that are copied; a mode of no known kind is `unknown`, never copied either."""
    import socket
    import stat

    made = {"fifo": tmp_short / "pipe", "socket": tmp_short / "sock"}
    os.mkfifo(made["fifo"])
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(made["socket"]))
    if os.geteuid() == 0:
        made["char_device"] = tmp_short / "null"
        os.mknod(made["char_device"], stat.S_IFCHR | 0o600, os.makedev(1, 3))
        made["block_device"] = tmp_short / "loop"
        os.mknod(made["block_device"], stat.S_IFBLK | 0o600, os.makedev(7, 0))
    for kind, path in made.items():
        assert fscopy.special_type(path.lstat().st_mode) == kind
        assert fscopy.copy_file(path, tmp_short / f"copy-{kind}") == kind
        assert not os.path.lexists(tmp_short / f"copy-{kind}")
    assert [(s.path, s.type) for s in fscopy.special_files(tmp_short)] == sorted(
        (p.name, k) for k, p in made.items()
    )
    (tmp_short / "file").write_text("x")
    (tmp_short / "link").symlink_to("file")
    for plain in ("file", "link", "."):
        assert fscopy.special_type((tmp_short / plain).lstat().st_mode) is None
    assert fscopy.special_type(0) == "unknown"


def _fds(src: Path, dest: Path) -> tuple[int, int]:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    return os.open(src, flags), os.open(dest, flags)


def test_copy_entry_at_copies_each_kind_and_reports_what_it_did_not_write(
    tmp_short: Path,
) -> None:
    """The ignored-file copy's entry primitive: a file, a symlink (as a link, never followed)
    and a whole directory (its mode and times kept) are written (True); a FIFO is reported and
    not written (False)."""
    src, dest = tmp_short / "src", tmp_short / "dest"
    src.mkdir()
    dest.mkdir()
    _tree(src)
    (src / "top.env").write_text("KEY=1\n")
    os.symlink("/etc/passwd", src / "top.link")
    os.mkfifo(src / "top.pipe")
    os.chmod(src / "a", 0o750)
    os.utime(src / "a", ns=(1_000_000_000, 2_000_000_000))
    sdir, ddir = _fds(src, dest)
    report = fscopy.Tally()
    try:
        wrote = {
            name: fscopy.copy_entry_at(sdir, ddir, name, name, skip=fscopy._never, report=report)
            for name in ("top.env", "top.link", "top.pipe", "a")
        }
    finally:
        os.close(sdir)
        os.close(ddir)
    assert wrote == {"top.env": True, "top.link": True, "top.pipe": False, "a": True}
    assert sorted(report.files) == ["a/b/g.txt", "a/exe", "a/f.txt", "a/out", "top.env", "top.link"]
    assert [(s.path, s.type) for s in report.special] == [
        ("top.pipe", "fifo"),
        ("a/b/pipe", "fifo"),
    ]
    assert (dest / "top.env").read_text() == "KEY=1\n"
    assert os.readlink(dest / "top.link") == "/etc/passwd"
    assert not os.path.lexists(dest / "top.pipe")
    assert (dest / "a" / "b" / "g.txt").read_text() == "two\n"
    assert (dest / "a").stat().st_mode & 0o777 == 0o750
    assert (dest / "a").stat().st_mtime_ns == 2_000_000_000


def test_merge_dir_at_adds_into_the_existing_directory_and_keeps_what_is_there(
    tmp_short: Path,
) -> None:
    src, dest = tmp_short / "src", tmp_short / "dest"
    (src / "node_modules" / "pkg").mkdir(parents=True)
    (src / "node_modules" / "pkg" / "index.js").write_text("new\n")
    (src / "node_modules" / "kept.js").write_text("theirs\n")
    (dest / "node_modules").mkdir(parents=True)
    (dest / "node_modules" / "kept.js").write_text("ours\n")
    sdir, ddir = _fds(src, dest)
    report = fscopy.Tally()
    try:
        merged = fscopy.merge_dir_at(
            sdir,
            ddir,
            "node_modules",
            "node_modules",
            skip=lambda rel: rel == "node_modules/kept.js",
            report=report,
        )
    finally:
        os.close(sdir)
        os.close(ddir)
    assert merged is True
    assert report.files == ["node_modules/pkg/index.js"]
    assert (dest / "node_modules" / "pkg" / "index.js").read_text() == "new\n"
    assert (dest / "node_modules" / "kept.js").read_text() == "ours\n"


def test_tally_at_counts_what_copy_entry_at_would_write(tmp_short: Path) -> None:
    src = tmp_short / "src"
    src.mkdir()
    _tree(src)
    (src / "one").write_bytes(b"x" * 10_000)
    os.symlink("one", src / "link")
    os.mkfifo(src / "pipe")
    sdir = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    try:
        one = fscopy.tally_at(sdir, "one")
        link = fscopy.tally_at(sdir, "link")
        pipe = fscopy.tally_at(sdir, "pipe")
        tree = fscopy.tally_at(sdir, "a")
        skipped = fscopy.tally_at(sdir, "a", lambda rel: rel == "b")  # below "a"
    finally:
        os.close(sdir)
    assert (one.entries, one.allocated) == (1, (src / "one").stat().st_blocks * 512)
    assert (link.entries, link.allocated, link.special) == (1, fscopy.DIR_COST, [])
    assert (pipe.entries, pipe.allocated) == (0, 0)
    assert [(s.path, s.type) for s in pipe.special] == [("pipe", "fifo")]
    # a, a/b, a/f.txt, a/b/g.txt, a/exe, a/out (the FIFO is listed, not counted)
    assert tree.entries == 6
    assert [(s.path, s.type) for s in tree.special] == [("b/pipe", "fifo")]
    blocks = sum((src / "a" / f).stat().st_blocks * 512 for f in ("f.txt", "exe", "b/g.txt"))
    assert tree.allocated == blocks + 3 * fscopy.DIR_COST  # a, a/b, the link a/out
    assert skipped.entries == 4 and skipped.special == []


def test_what_is_skipped_or_gone_since_the_listing_is_neither_counted_nor_copied(
    tmp_short: Path,
) -> None:
    """`skip` leaves an entry and everything under it; an entry deleted between the listing
    of its directory and its lstat (done here from the skip callback, which runs between the
    two) is passed over and the walk goes on."""
    src = tmp_short / "src"
    src.mkdir()
    _tree(src)
    (src / "z-late").write_text("gone soon\n")
    seen: list[str] = []

    def skip(rel: str) -> bool:
        seen.append(rel)
        if rel == "a/exe" and seen.count(rel) == 2:  # the copy's walk, after the tally's
            (src / "a" / "exe").unlink()
        return rel == "a/b"

    done = fscopy.copy_tree(src, tmp_short / "dest", skip=skip)
    assert sorted(done.files) == ["a/f.txt", "a/out", "z-late"]
    assert done.special == []
    assert not (tmp_short / "dest" / "a" / "b").exists()
    (src / "a" / "gone").write_text("x")
    gone_seen: list[str] = []

    def gone(rel: str) -> bool:
        gone_seen.append(rel)
        if rel == "a/gone":
            (src / "a" / "gone").unlink()
        return False

    counted = fscopy.tally(src, gone)
    assert "a/gone" in gone_seen and "a/gone" not in counted.files
    assert sorted(counted.files) == ["a/b/g.txt", "a/f.txt", "a/out", "z-late"]
    assert sorted(rel for rel, _size in fscopy.files_within(src)) == sorted(counted.files)


def test_a_failed_merge_removes_what_it_made_inside_an_existing_directory(
    tmp_short: Path,
) -> None:
    """merge_tree into a directory that has `a/` already: the copy goes into it (a restore);
    a file it would replace is an error, and the names it made are removed, the existing
    ones kept."""
    src, dest = tmp_short / "src", tmp_short / "dest"
    src.mkdir()
    _tree(src)
    (dest / "a").mkdir(parents=True)
    (dest / "a" / "mine").write_text("mine\n")
    (src / "z-new").write_text("new\n")
    done = fscopy.merge_tree(src, dest)
    assert (dest / "a" / "mine").read_text() == "mine\n"
    assert (dest / "a" / "b" / "g.txt").read_text() == "two\n"
    assert sorted(done.files) == ["a/b/g.txt", "a/exe", "a/f.txt", "a/out", "z-new"]
    shutil.rmtree(dest / "a" / "b")
    (dest / "z-new").unlink()
    with pytest.raises(FileExistsError):
        fscopy.merge_tree(src, dest)  # a/exe is there already: never replaced
    assert sorted(os.listdir(dest)) == ["a"]
    assert (dest / "a" / "mine").read_text() == "mine\n"


def test_without_copy_file_range_the_data_is_read_and_written(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel or filesystem without copy_file_range (ENOSYS, EXDEV: a fault here) falls back
    to reads and writes of each data extent; holes still stay holes. Another error fails."""
    import errno

    def unsupported(*_args: object) -> int:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(BACKEND, "copy_file_range", unsupported)
    sparse = tmp_short / "sparse"
    data = os.urandom(3 << 20)
    with sparse.open("wb") as out:
        out.write(data)
        out.truncate(64 << 20)
    assert fscopy.copy_file(sparse, tmp_short / "copy") is None
    copy = tmp_short / "copy"
    assert copy.stat().st_size == 64 << 20
    assert copy.stat().st_blocks * 512 < 8 << 20
    with copy.open("rb") as read:
        assert read.read(len(data)) == data

    def broken(*_args: object) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(BACKEND, "copy_file_range", broken)
    with pytest.raises(OSError) as failed:
        fscopy.copy_file(sparse, tmp_short / "copy2")
    assert failed.value.errno == errno.EIO
    assert not os.path.lexists(tmp_short / "copy2")


def test_copy_file_refuses_a_directory_and_copies_a_link_as_a_link(tmp_short: Path) -> None:
    (tmp_short / "dir").mkdir()
    with pytest.raises(IsADirectoryError):
        fscopy.copy_file(tmp_short / "dir", tmp_short / "dir2")
    assert not os.path.lexists(tmp_short / "dir2")
    (tmp_short / "link").symlink_to("/etc/passwd")
    assert fscopy.copy_file(tmp_short / "link", tmp_short / "link2") is None
    assert os.readlink(tmp_short / "link2") == "/etc/passwd"
    (tmp_short / "file").write_text("x")
    fscopy.remove_partial(tmp_short / "link2")
    fscopy.remove_partial(tmp_short / "missing")
    assert not os.path.lexists(tmp_short / "link2") and (tmp_short / "file").exists()
    assert Path("/etc/passwd").exists()
