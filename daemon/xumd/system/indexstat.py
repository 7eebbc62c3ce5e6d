"""A git index for a copy of a checkout: the source checkout's index with each entry's stat data
replaced by the copy's file's, so git sees the copy clean without reading a byte of it.

A checkout cloned file by file (system/reflink.py) holds the same bytes as its source, but
every file has a new inode and ctime: with the source's index git would find every entry's
stat data changed and hash every file again (`update-index --refresh`: the whole checkout
read). The entries themselves (path, mode, object id, flags) are the source's, which is right
exactly when the copy's bytes are the source's and the source's files are the ones its index
describes; `Entries.unchanged` is git's own test of the latter (the stat data an index entry
records against the file's lstat), made on every source file during the clone.

Only what is read here is written: index versions 2 and 3 with SHA-1 object ids, no split
index (`link`), no sparse index (`sdir`), no skip-worktree entries and no gitlinks (a
submodule's checkout is not a file to clone). Anything else is `Unsupported`, and the caller
lets git write the checkout. The cache tree (`TREE`) is kept (it describes the same entries);
every other extension is dropped (each is an optional cache git rebuilds).
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_HEADER = struct.Struct(">4sII")
_STAT = struct.Struct(">10I")
_FLAGS = struct.Struct(">H")
_HASH = 20
_NAME_MASK = 0x0FFF
_EXTENDED = 0x4000
_STAGE_MASK = 0x3000
_SKIP_WORKTREE = 0x4000  # in the extended flags
_GITLINK = 0o160000
_KEPT_EXTENSIONS = {b"TREE"}
_REFUSED_EXTENSIONS = {b"link", b"sdir"}


class Unsupported(Exception):
    """An index this module does not rewrite (the reason is the message)."""


def _u32(value: int) -> int:
    return value & 0xFFFFFFFF


def stat_fields(st: os.stat_result) -> tuple[int, ...]:
    """The ten stat words git records for a file (ctime, mtime, dev, ino, mode, uid, gid,
    size; each truncated to 32 bits as git truncates it)."""
    return (
        _u32(int(st.st_ctime)),
        _u32(st.st_ctime_ns % 1_000_000_000),
        _u32(int(st.st_mtime)),
        _u32(st.st_mtime_ns % 1_000_000_000),
        _u32(st.st_dev),
        _u32(st.st_ino),
        0,  # the mode word: the entry's own, kept
        _u32(st.st_uid),
        _u32(st.st_gid),
        _u32(st.st_size),
    )


@dataclass(slots=True)
class _Entry:
    offset: int
    """Where the entry's stat words start in the index bytes."""
    stat: tuple[int, ...]
    mode: int


@dataclass(slots=True)
class Entries:
    """The entries of one index, by path."""

    data: bytes
    version: int
    by_path: dict[str, _Entry]
    end: int
    """Where the entries end (the extensions start)."""
    kept: bytes
    """The extensions written back (the cache tree)."""

    def unchanged(self, rel: str, st: os.stat_result) -> bool:
        """Git's test that the file at `rel` is the one the entry describes: its stat words
        (but the mode's, which git tests as the file type and executable bit) as recorded."""
        entry = self.by_path.get(rel)
        if entry is None:
            return False
        now = stat_fields(st)
        if now[:6] != entry.stat[:6] or now[7:] != entry.stat[7:]:
            return False
        if stat.S_ISLNK(st.st_mode):
            return stat.S_IFMT(entry.mode) == stat.S_IFLNK
        executable = bool(st.st_mode & 0o100)
        return stat.S_ISREG(st.st_mode) and executable == bool(entry.mode & 0o100)


def read(path: Path) -> Entries:
    data = path.read_bytes()
    if len(data) < _HEADER.size + _HASH:
        raise Unsupported(f"{path} is too short to be an index")
    if hashlib.sha1(data[:-_HASH]).digest() != data[-_HASH:]:
        raise Unsupported(f"{path}: checksum mismatch (not a SHA-1 index, or damaged)")
    signature, version, count = _HEADER.unpack_from(data)
    if signature != b"DIRC" or version not in (2, 3):
        raise Unsupported(f"{path}: index version {version} (only 2 and 3 are rewritten)")
    by_path: dict[str, _Entry] = {}
    pos = _HEADER.size
    for _ in range(count):
        start = pos
        words = _STAT.unpack_from(data, pos)
        pos += _STAT.size + _HASH
        (flags,) = _FLAGS.unpack_from(data, pos)
        pos += _FLAGS.size
        if flags & _EXTENDED:
            if version < 3:
                raise Unsupported(f"{path}: an extended entry in a version 2 index")
            (extended,) = _FLAGS.unpack_from(data, pos)
            pos += _FLAGS.size
            if extended & _SKIP_WORKTREE:
                raise Unsupported(f"{path}: a skip-worktree entry (a sparse checkout)")
        length = flags & _NAME_MASK
        if length == _NAME_MASK:
            length = data.index(b"\0", pos) - pos
        name = data[pos : pos + length]
        pos += length
        pos += 8 - ((pos - start) % 8)  # 1 to 8 NULs: the entry's length a multiple of 8
        if flags & _STAGE_MASK:
            raise Unsupported(f"{path}: an unmerged entry ({name!r})")
        if words[6] & 0o170000 == _GITLINK:
            raise Unsupported(f"{path}: a gitlink ({name!r}): submodules are git's to check out")
        by_path[name.decode("utf-8", "surrogateescape")] = _Entry(start, words, words[6])
    end = pos
    kept = bytearray()
    while pos < len(data) - _HASH:
        signature = data[pos : pos + 4]
        (size,) = struct.unpack_from(">I", data, pos + 4)
        if signature in _REFUSED_EXTENSIONS:
            raise Unsupported(f"{path}: extension {signature.decode()!r}")
        if signature in _KEPT_EXTENSIONS:
            kept += data[pos : pos + 8 + size]
        pos += 8 + size
    return Entries(data, version, by_path, end, bytes(kept))


def write(entries: Entries, stats: Mapping[str, os.stat_result], dest: Path) -> None:
    """Write `entries` to the index `dest` with each entry's stat words from `stats` (every
    entry must have one), under git's lock protocol (`dest.lock` made exclusively, written,
    fsynced, renamed over `dest`)."""
    out = bytearray(entries.data[: entries.end])
    for rel, entry in entries.by_path.items():
        words = list(stat_fields(stats[rel]))
        words[6] = entry.mode
        _STAT.pack_into(out, entry.offset, *words)
    out += entries.kept
    out += hashlib.sha1(out).digest()
    lock = dest.with_name(dest.name + ".lock")
    fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(out)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        lock.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(lock, dest)
