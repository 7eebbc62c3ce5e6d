"""Entries of a checkout kept as they are: what the proof (lifecycle/onbytes.py) found a
snapshot cannot give back, saved under the archive store's `raw/` and written back by unarchive.

Every path is opened one component at a time from the top by descriptor, with O_NOFOLLOW
(fscopy.open_parents): a path deeper than PATH_MAX is saved and placed whole, and a symlink
on the way is never followed. The copies are fscopy's (a link as a link, holes kept, special
files and other mounts left out, space checked first).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from xumd.system import fscopy, walk

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_CHUNK = 1 << 20


def _never(_rel: str) -> bool:
    return False


def save(checkout: Path, paths: Iterable[str], dest: Path) -> fscopy.Tally:
    """Copy each entry (a file, a link, a directory whole) of `checkout` to the same relative
    path under `dest` (made here; must not exist). Space is checked for all of them first."""
    paths = list(paths)
    report = fscopy.Tally()
    src_fd = os.open(checkout, _DIR_FLAGS)
    try:
        needed = fscopy.Tally()
        for rel in paths:
            parts = rel.split("/")
            parent = fscopy.open_parents(src_fd, parts)
            try:
                found = fscopy.tally_at(parent, parts[-1], rel=rel)
            finally:
                os.close(parent)
            needed.allocated += found.allocated
            needed.entries += found.entries + len(parts)
        os.makedirs(dest.parent, exist_ok=True)
        fscopy.check_space(dest.parent, needed.allocated, needed.entries, "the raw entries")
        os.mkdir(dest, 0o700)
        dest_fd = os.open(dest, _DIR_FLAGS)
        try:
            for rel in paths:
                parts = rel.split("/")
                sdir = fscopy.open_parents(src_fd, parts)
                try:
                    ddir = fscopy.open_parents(dest_fd, parts, create_like=0o700)
                    try:
                        fscopy.copy_entry_at(sdir, ddir, parts[-1], rel, skip=_never, report=report)
                    finally:
                        os.close(ddir)
                finally:
                    os.close(sdir)
        finally:
            os.close(dest_fd)
    finally:
        os.close(src_fd)
    return report


@dataclass(slots=True)
class Placed:
    placed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Paths where something else stands that is never deleted to make room (a directory that
    is not empty), or whose way leads through a symlink."""


def place(source: Path, checkout: Path, paths: Iterable[str]) -> Placed:
    """Write each saved entry back into `checkout`, over what the restore wrote there (a file,
    a link, an empty directory: a gitlink's); an entry already in place byte for byte is left."""
    done = Placed()
    paths = list(paths)
    src_fd = os.open(source, _DIR_FLAGS)
    try:
        fscopy.check_space(checkout, *_needed(src_fd, paths), "the raw entries")
        dst_fd = os.open(checkout, _DIR_FLAGS)
        try:
            for rel in paths:
                if _place_one(src_fd, dst_fd, rel):
                    done.placed.append(rel)
                else:
                    done.problems.append(rel)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)
    return done


def _needed(src_fd: int, paths: list[str]) -> tuple[int, int]:
    """(bytes, inodes) a copy of the saved entries takes."""
    size = inodes = 0
    for rel in paths:
        parts = rel.split("/")
        try:
            parent = fscopy.open_parents(src_fd, parts)
        except FileNotFoundError:
            continue
        try:
            found = fscopy.tally_at(parent, parts[-1], rel=rel)
        except FileNotFoundError:
            continue
        finally:
            os.close(parent)
        size += found.allocated
        inodes += found.entries + len(parts)
    return size, inodes


def _place_one(src_fd: int, dst_fd: int, rel: str) -> bool:
    parts = rel.split("/")
    try:
        sdir = fscopy.open_parents(src_fd, parts)
    except FileNotFoundError:
        return False
    try:
        try:
            ddir = fscopy.open_parents(dst_fd, parts, create_like=0o777)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                return False  # a symlink on the way: never written through
            raise
        try:
            name = parts[-1]
            if _same_at(sdir, ddir, name):
                return True
            if not _clear(ddir, name):
                return False
            fscopy.copy_entry_at(sdir, ddir, name, rel, skip=_never, report=fscopy.Tally())
            return True
        finally:
            os.close(ddir)
    finally:
        os.close(sdir)


def _clear(dir_fd: int, name: str) -> bool:
    """Make room for `name`: a file or link goes, an empty directory goes; anything else stays
    (False)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    if stat.S_ISDIR(st.st_mode):
        try:
            os.rmdir(name, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            raise
        return True
    os.unlink(name, dir_fd=dir_fd)
    return True


def same(source: Path, checkout: Path, rel: str) -> bool:
    """Whether `rel` in `checkout` is the saved entry byte for byte (a directory: every entry
    under it, by name, kind, link target, bytes and executable bit)."""
    parts = rel.split("/")
    try:
        src_fd = os.open(source, _DIR_FLAGS)
    except OSError:
        return False
    try:
        dst_fd = os.open(checkout, _DIR_FLAGS)
    except OSError:
        os.close(src_fd)
        return False
    try:
        sdir = fscopy.open_parents(src_fd, parts)
        try:
            ddir = fscopy.open_parents(dst_fd, parts)
        except OSError:
            os.close(sdir)
            return False
        try:
            return _same_at(sdir, ddir, parts[-1])
        finally:
            os.close(sdir)
            os.close(ddir)
    except OSError:
        return False  # not proven the same: the saved copy is kept
    finally:
        os.close(src_fd)
        os.close(dst_fd)


def _same_at(a_dir: int, b_dir: int, name: str) -> bool:
    try:
        sa = os.stat(name, dir_fd=a_dir, follow_symlinks=False)
        sb = os.stat(name, dir_fd=b_dir, follow_symlinks=False)
    except OSError:
        return False
    if not _same_entry(a_dir, b_dir, name, sa, sb):
        return False
    if not stat.S_ISDIR(sa.st_mode):
        return True
    a_sub = os.open(name, _DIR_FLAGS, dir_fd=a_dir)
    try:
        b_sub = os.open(name, _DIR_FLAGS, dir_fd=b_dir)
        try:
            if fscopy.other_mount(b_sub, walk.mount_identity(b_dir)):
                return False
            return _same_below(a_sub, b_sub)
        finally:
            os.close(b_sub)
    finally:
        os.close(a_sub)


def _same_entry(a_dir: int, b_dir: int, name: str, sa: os.stat_result, sb: os.stat_result) -> bool:
    """Whether two entries of one name are the same kind and, for a link or a file, the same
    target or bytes and executable bit (a directory's content is the walk's to compare)."""
    if stat.S_IFMT(sa.st_mode) != stat.S_IFMT(sb.st_mode):
        return False
    if stat.S_ISLNK(sa.st_mode):
        return os.readlink(name, dir_fd=a_dir) == os.readlink(name, dir_fd=b_dir)
    if stat.S_ISREG(sa.st_mode):
        if sa.st_size != sb.st_size or (sa.st_mode ^ sb.st_mode) & stat.S_IXUSR:
            return False
        return _same_content(a_dir, b_dir, name)
    return True  # a directory, or a special file: nothing was saved of those


_SIDE_BY_SIDE = walk.Policy(sort=False, listings=True, leave=True)
"""The saved tree walked with the checkout's directory of the same path alongside."""


def _same_below(a_top: int, b_top: int) -> bool:
    """Whether the open directories hold the same entries by name, kind, link target, bytes
    and executable bit, all the way down (special files only by name: nothing was saved of
    them). `a_top` is walked (`walk.Walk`); `b_top`'s directory of the same path follows it,
    never through a link nor onto another mount."""
    b_mount = walk.mount_identity(b_top)
    b_fds = [b_top]
    try:
        for step in walk.Walk(a_top, _SIDE_BY_SIDE):
            b = b_fds[-1]
            if step.kind == walk.LISTED:
                if _kept(step.entries) != _names(b):
                    return False
            elif step.kind == walk.LEAVE:
                os.close(b_fds.pop())
            elif step.kind == walk.MOUNT:
                return False  # not walked, so not proven the same
            elif step.fd is not None:
                b_sub = os.open(step.name, _DIR_FLAGS, dir_fd=b)
                if fscopy.other_mount(b_sub, b_mount):
                    os.close(b_sub)
                    return False
                b_fds.append(b_sub)
            elif step.is_file() or step.is_symlink():
                sb = os.stat(step.name, dir_fd=b, follow_symlinks=False)
                if not _same_entry(step.dir_fd, b, step.name, step.lstat(), sb):
                    return False
    finally:
        for fd in b_fds[1:]:
            os.close(fd)
    return True


def _kept(entries: list[os.DirEntry[str]]) -> list[str]:
    """The names of a listing that a saved copy holds (not its special files)."""
    return sorted(
        e.name
        for e in entries
        if e.is_dir(follow_symlinks=False) or e.is_file(follow_symlinks=False) or e.is_symlink()
    )


def _names(fd: int) -> list[str]:
    with os.scandir(fd) as it:
        return _kept(list(it))


def _same_content(a_dir: int, b_dir: int, name: str) -> bool:
    a = os.open(name, _READ_FLAGS, dir_fd=a_dir)
    try:
        b = os.open(name, _READ_FLAGS, dir_fd=b_dir)
        try:
            while True:
                ca, cb = os.read(a, _CHUNK), os.read(b, _CHUNK)
                if ca != cb:
                    return False
                if not ca:
                    return True
        finally:
            os.close(b)
    finally:
        os.close(a)
