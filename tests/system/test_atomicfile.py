"""The one atomic write (xumd.system.atomicfile): the old file survives any failure, no temporary
file
stays behind, and a durable write flushes the directory once the rename is done."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
from xumd.system import atomicfile
from xumd.system.atomicfile import write_atomic

from tests.support.tmpfs import fill, tmpfs

TEMP_NAMES = pytest.mark.parametrize("temp_name", [None, "state.tmp"], ids=["fresh", "fixed"])


@TEMP_NAMES
def test_the_new_content_replaces_the_old_and_nothing_else_stays(
    tmp_path: Path, temp_name: str | None
) -> None:
    target = tmp_path / "state"
    target.write_bytes(b"old")
    write_atomic(target, b"new", durable=True, mode=0o600, temp_name=temp_name)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["state"]


@TEMP_NAMES
def test_a_full_filesystem_mid_write_leaves_the_old_file_and_no_temporary_file(
    tmp_path: Path, temp_name: str | None
) -> None:
    with tmpfs(tmp_path / "fs") as fs:
        target = fs / "state"
        target.write_bytes(b"old")
        filler = fill(fs)
        with pytest.raises(OSError) as caught:
            write_atomic(target, b"new" * 100_000, durable=True, temp_name=temp_name)
        assert caught.value.errno == errno.ENOSPC
        assert target.read_bytes() == b"old"
        assert sorted(os.listdir(fs)) == sorted([filler.name, "state"])


@TEMP_NAMES
def test_a_failed_rename_leaves_the_target_and_no_temporary_file(
    tmp_path: Path, temp_name: str | None
) -> None:
    # A directory at the target's name: the rename of a file over it fails (EISDIR).
    target = tmp_path / "state"
    target.mkdir()
    (target / "inside").write_bytes(b"kept")
    with pytest.raises(IsADirectoryError):
        write_atomic(target, b"new", durable=True, temp_name=temp_name)
    assert (target / "inside").read_bytes() == b"kept"
    assert os.listdir(tmp_path) == ["state"]


def test_without_a_mode_the_file_is_readable_by_all_and_written_by_its_owner(
    tmp_path: Path,
) -> None:
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "state", b"new", durable=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o644


def test_a_fresh_temporary_name_taken_by_another_writer_is_left_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers of one file at once: each its own temporary file, never the other's."""
    names = iter(["taken", "free"])
    monkeypatch.setattr(atomicfile.secrets, "token_hex", lambda _n: next(names))
    theirs = tmp_path / ".state.taken.tmp"
    theirs.write_bytes(b"another writer's")
    write_atomic(tmp_path / "state", b"new", durable=False)
    assert (tmp_path / "state").read_bytes() == b"new"
    assert theirs.read_bytes() == b"another writer's"
    assert sorted(os.listdir(tmp_path)) == [".state.taken.tmp", "state"]


def test_a_leftover_at_the_fixed_temporary_name_is_written_over(tmp_path: Path) -> None:
    """A crash between the temporary file and the rename leaves it: the next write reuses it."""
    (tmp_path / "state.tmp").write_bytes(b"half of a crashed write, longer than the new one")
    write_atomic(tmp_path / "state", b"new", durable=False, temp_name="state.tmp")
    assert (tmp_path / "state").read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["state"]


def test_a_symlink_at_the_fixed_temporary_name_is_never_followed(tmp_path: Path) -> None:
    """The directory may be someone else's (a checkout): a link planted at the temporary name
    must not make the write land where it points."""
    outside = tmp_path / "outside"
    outside.write_bytes(b"theirs")
    directory = tmp_path / "checkout"
    directory.mkdir()
    (directory / "state.tmp").symlink_to(outside)
    with pytest.raises(OSError) as caught:
        write_atomic(directory / "state", b"new", durable=False, temp_name="state.tmp")
    assert caught.value.errno == errno.ELOOP
    assert outside.read_bytes() == b"theirs"
    assert not (directory / "state").exists()


@pytest.mark.parametrize("durable", [True, False])
def test_the_directory_is_fsynced_after_the_rename_only_when_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    target = tmp_path / "state"
    target.write_bytes(b"old")
    flushed: list[tuple[str, bytes]] = []  # what each fsync flushed, and the target then
    fsync = os.fsync

    def counting(fd: int) -> None:
        kind = "directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        flushed.append((kind, target.read_bytes()))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", counting)
    write_atomic(target, b"new", durable=durable)
    # The file's content is flushed before the rename; the directory, after it.
    expected = [("file", b"old")] + ([("directory", b"new")] if durable else [])
    assert flushed == expected


def test_an_fsync_that_fails_leaves_the_old_file_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that reports an I/O error on the flush: the new content may not be on it, so it
    never replaces the old."""
    target = tmp_path / "state"
    target.write_bytes(b"old")

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError) as caught:
        write_atomic(target, b"new", durable=True)
    assert caught.value.errno == errno.EIO
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["state"]
