"""The one copy primitive for a checkout's files (the directory runtime's archive store and the
preserved ignored files).

- It walks by file descriptor (`openat` with O_NOFOLLOW, `dir_fd` everywhere): a symlink is
  copied as a link and never followed, and a directory swapped for a link during the copy is
  refused instead of leading the walk outside the tree.
- It never opens a special file (named pipe, socket, device): reading a FIFO blocks, and reading
  a device such as /dev/zero never ends (it filled the archive store to the last byte). They are
  skipped and reported with their type, and the copy goes on.
- It keeps holes (SEEK_DATA/SEEK_HOLE) and tries a copy-on-write clone (FICLONE) first, then
  `copy_file_range` per data extent, then plain reads and writes: the copy costs at most what the
  source has allocated.
- It checks free space (and inodes) at the destination against the source's allocated size
  (st_blocks * 512) before writing anything, and refuses `disk_full` naming the space needed.
- It never enters another mount: a directory on another device, or with another mount id (a
  bind mount of the same filesystem keeps `st_dev`), is left out and reported (`Tally.mounts`),
  as the deletions of fsdelete.py never cross one.
- On any failure it removes what it wrote.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from xum_protocol.errors import ErrorKind

from xumd.base.errors import XumError
from xumd.system import diskfull, fsdelete, walk
from xumd.system.platform import current

FICLONE = 0x40049409
"""ioctl(dest, FICLONE, src): share the source's extents (btrfs, XFS with reflink, bcachefs)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: if a file was swapped for a FIFO between the lstat and the open, the open must
# not block (the fstat that follows then refuses it).
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 8 << 20
SPACE_MARGIN = 1 << 20
"""Kept free beyond the copy's own size (directories, manifests, metadata)."""
DIR_COST = 4096
"""What one directory or symlink costs at the destination (one block)."""


def special_type(mode: int) -> str | None:
    """The type of a file that is never opened for copying (None: regular, directory, link)."""
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode):
        return "char_device"
    if stat.S_ISBLK(mode):
        return "block_device"
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode):
        return None
    return "unknown"


@dataclass
class Special:
    path: str
    type: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "type": self.type}


@dataclass
class Tally:
    """What a tree holds: its copyable entries and their allocated size, and its special files."""

    entries: int = 0
    allocated: int = 0
    files: list[str] = field(default_factory=list)
    special: list[Special] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    """Directories on another mount: not entered, not copied."""
    cloned: int = 0
    """Files whose data was shared copy-on-write (FICLONE) instead of copied."""
    between: Callable[[], object] | None = None
    """Called between chunks of a file's data: a deadline check may raise there, so one large
    file does not hold a stop until it is whole."""


def other_mount(fd: int, top: tuple[int, int | None]) -> bool:
    """Whether the open directory `fd` is on another mount than `top`
    (`fsdelete.mount_identity`, the test its deletions use)."""
    return walk.mount_identity(fd) != top


Skip = Callable[[str], bool]
"""Called with each entry's path relative to the top; True leaves it (and what is under it)."""


def _never(_rel: str) -> bool:
    return False


def _skipping(skip: Skip) -> Skip | None:
    return None if skip is _never else skip


def _tolerated(_rel: str, _exc: OSError) -> None:
    """A usage walk's errors: what cannot be read is not counted."""


def open_parents(root_fd: int, parts: list[str], *, create_like: int | None = None) -> int:
    """The directory holding the last of `parts`, opened component by component with
    O_NOFOLLOW from `root_fd` (a symlink anywhere on the way is ELOOP/ENOTDIR, never followed).
    With `create_like` (a mode: the source directory's), missing directories are made. An
    error names the directory it is about (`parts` up to it: `fsdelete.named`)."""
    fd = os.dup(root_fd)
    try:
        for at, part in enumerate(parts[:-1], 1):
            try:
                try:
                    sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if create_like is None:
                        raise
                    os.mkdir(part, create_like, dir_fd=fd)
                    sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise walk.named(exc, "/".join(parts[:at])) from exc
            os.close(fd)
            fd = sub
        return fd
    except BaseException:
        os.close(fd)
        raise


def tally(top: Path, skip: Skip = _never) -> Tally:
    """Count what a copy of `top` would write (special files are listed, not counted)."""
    found = Tally()
    top_fd = os.open(top, _DIR_FLAGS)
    try:
        _count_below(found, top_fd, skip)
    finally:
        os.close(top_fd)
    return found


def _count_below(found: Tally, top_fd: int, skip: Skip, prefix: str = "") -> None:
    """Add what is under the open directory `top_fd` to `found` (paths relative to it; an
    error names `prefix` + its path)."""
    for step in walk.Walk(top_fd, walk.Policy(skip=_skipping(skip), prefix=prefix)):
        if step.kind == walk.MOUNT:
            found.mounts.append(step.rel)
            continue
        st = step.lstat()
        kind = special_type(st.st_mode)
        if kind is not None:
            found.special.append(Special(step.rel, kind))
            continue
        found.entries += 1
        if stat.S_ISREG(st.st_mode):
            found.allocated += st.st_blocks * 512
            found.files.append(step.rel)
        else:
            found.allocated += DIR_COST
            if stat.S_ISLNK(st.st_mode):
                found.files.append(step.rel)


def files_within(top: Path) -> list[tuple[str, int]]:
    """(path relative to `top`, size) of every regular file and symlink under the directory
    `top`: a usage walk (the ignored files an archive drops). By descriptor, so a file whose
    full path is longer than PATH_MAX still counts; what cannot be read is skipped; another
    mount is not entered (what sits on it is not the checkout's)."""
    try:
        top_fd = os.open(top, _DIR_FLAGS)
    except OSError:
        return []
    try:
        return [
            (step.rel, step.st.st_size)
            for step in walk.Walk(top_fd, walk.Policy(errors=_tolerated))
            if step.kind == walk.ENTRY
            and step.st is not None
            and (stat.S_ISREG(step.st.st_mode) or stat.S_ISLNK(step.st.st_mode))
        ]
    finally:
        os.close(top_fd)


def special_files(top: Path, skip: Skip = _never) -> list[Special]:
    """The special files under `top` (never opened), for reporting in `dropped`. It runs on
    every archive and remove of a worktree, so it costs one `getdents` per directory: the
    entry types come from the directory listing (d_type); only a special entry (or one whose
    type the filesystem does not report) is `lstat`ed. Another mount is not entered (what sits
    on it is not the checkout's)."""
    found: list[Special] = []
    try:
        top_fd = os.open(top, _DIR_FLAGS)
    except OSError:
        return found
    how = walk.Policy(
        sort=False,  # sorted once, at the end
        stat=False,
        files=False,
        listings=True,
        mount_ids=fsdelete.mounts_below(top),
        skip=_skipping(skip),
        errors=_tolerated,
    )
    try:
        for step in walk.Walk(top_fd, how):
            if step.kind != walk.LISTED:
                continue
            base = f"{step.rel}/" if step.rel else ""
            step.dirs = dirs = []
            for entry in step.entries:
                child = base + entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        dirs.append(entry)
                        continue
                    if entry.is_file(follow_symlinks=False) or entry.is_symlink() or skip(child):
                        continue
                    kind = special_type(entry.stat(follow_symlinks=False).st_mode)
                except OSError:
                    continue  # gone or replaced since the listing
                if kind is not None:
                    found.append(Special(child, kind))
    finally:
        os.close(top_fd)
    return sorted(found, key=lambda s: s.path)


def check_space(dest_dir: Path, needed_bytes: int, needed_inodes: int, what: str) -> None:
    """Refuse `disk_full` when the filesystem of `dest_dir` cannot take the copy."""
    vfs = os.statvfs(dest_dir)
    available = vfs.f_bavail * vfs.f_frsize
    if needed_bytes + SPACE_MARGIN > available:
        # The same fields as every other disk_full (the filesystem, as `df` names it); looked
        # up only when refusing (it reads /proc/self/mountinfo).
        fs = diskfull.filesystem_of(dest_dir)
        raise XumError(
            ErrorKind.DISK_FULL,
            f"not enough space to copy {what}: it needs {needed_bytes} bytes (plus "
            f"{SPACE_MARGIN} spare) and {fs.describe()} has {available} free; nothing was "
            "written; free space there and retry",
            needed_bytes=needed_bytes,
            available_bytes=available,
            path=str(dest_dir),
            **fs.data(),
        )
    # f_files == 0: the filesystem has no inode limit (btrfs reports none).
    if vfs.f_files and needed_inodes > vfs.f_favail:
        fs = diskfull.filesystem_of(dest_dir)
        raise XumError(
            ErrorKind.DISK_FULL,
            f"not enough inodes to copy {what}: it needs {needed_inodes} and {fs.describe()} "
            f"has {vfs.f_favail} free; nothing was written; free inodes there and retry",
            needed_inodes=needed_inodes,
            available_inodes=vfs.f_favail,
            path=str(dest_dir),
            **fs.data(),
        )


def _copy_data(src: int, dst: int, size: int, between: Callable[[], object] | None = None) -> bool:
    """The data extents of `src` into `dst` at the same offsets; holes stay holes. True when
    the data was cloned (shared copy-on-write) rather than copied."""
    try:
        fcntl.ioctl(dst, FICLONE, src)
        return True
    except OSError:
        pass  # not a filesystem with reflinks, or across filesystems: copy the extents
    offset = 0
    while offset < size:
        try:
            start = os.lseek(src, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break  # only a hole from here to the end
            if exc.errno != errno.EINVAL:
                raise
            start = offset  # SEEK_DATA unsupported: all of it is data
            end = size
        else:
            end = min(os.lseek(src, start, os.SEEK_HOLE), size)
        _copy_range(src, dst, start, end, between)
        offset = end
    os.ftruncate(dst, size)
    return False


def _copy_range(
    src: int, dst: int, start: int, end: int, between: Callable[[], object] | None
) -> None:
    pos = start
    while pos < end:
        if between is not None and pos > start:
            between()
        count = min(_CHUNK, end - pos)
        try:
            done = current().copy_file_range(src, dst, count, pos, pos)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            done = _copy_plain(src, dst, pos, count)
        if done == 0:
            return  # the source shrank meanwhile
        pos += done


def _copy_plain(src: int, dst: int, pos: int, count: int) -> int:
    data = os.pread(src, count, pos)
    view = memoryview(data)
    written = 0
    while written < len(data):
        written += os.pwrite(dst, view[written:], pos + written)
    return len(data)


def _copy_file(
    sdir: int,
    ddir: int,
    name: str,
    st: os.stat_result,
    dest_name: str | None = None,
    *,
    report: Tally | None = None,
) -> bool:
    """Copy one regular file; False when it turned out not to be one (then nothing is made).
    A destination it created and could not finish is removed (one that existed is an error
    and is left alone)."""
    dest_name = dest_name or name
    src = os.open(name, _READ_FLAGS, dir_fd=sdir)
    try:
        now = os.fstat(src)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False
        dst = os.open(dest_name, _WRITE_FLAGS, 0o600, dir_fd=ddir)
        try:
            between = report.between if report is not None else None
            if _copy_data(src, dst, now.st_size, between) and report is not None:
                report.cloned += 1
            os.fchmod(dst, stat.S_IMODE(now.st_mode))
            os.utime(dst, ns=(now.st_atime_ns, now.st_mtime_ns))
        except BaseException:
            os.close(dst)
            os.unlink(dest_name, dir_fd=ddir)
            raise
        os.close(dst)
        return True
    finally:
        os.close(src)


def copy_tree(src: Path, dest: Path, *, skip: Skip = _never, what: str = "") -> Tally:
    """Copy the tree `src` to `dest` (which must not exist; its parent must). Checks space
    first; on any failure removes `dest` and re-raises. Returns what was copied and the
    special files that were skipped."""
    return _copy(src, dest, skip=skip, what=what or str(src), merge=False)


def merge_tree(src: Path, dest: Path, *, skip: Skip = _never, what: str = "") -> Tally:
    """Copy the entries of `src` into the existing directory `dest` (a new file never replaces
    one that is there: that is an error). On failure the entries it created are removed."""
    return _copy(src, dest, skip=skip, what=what or str(src), merge=True)


def _copy(src: Path, dest: Path, *, skip: Skip, what: str, merge: bool) -> Tally:
    plan = tally(src, skip)
    check_space(dest if merge else dest.parent, plan.allocated, plan.entries + 1, what)
    report = Tally()
    src_fd = os.open(src, _DIR_FLAGS)
    created: list[str] = []
    try:
        if merge:
            before = set(os.listdir(dest))
        else:
            os.mkdir(dest, 0o700)
            before = set()
        dst_fd = os.open(dest, _DIR_FLAGS)
        try:
            _copy_tree_fds(src_fd, dst_fd, skip, report)
        finally:
            os.close(dst_fd)
        st = os.fstat(src_fd)
        if not merge:
            os.chmod(dest, stat.S_IMODE(st.st_mode))
    except BaseException:
        if merge:
            # Only what this copy can have made: a new top-level name that `src` has too.
            # Anything else new in `dest` (written meanwhile by someone else) is not ours.
            ours = set(os.listdir(src))
            created = [n for n in os.listdir(dest) if n not in before and n in ours]
            for name in created:
                remove_partial(dest / name)
        else:
            fsdelete.remove_tree(dest, ignore_errors=True)
        raise
    finally:
        os.close(src_fd)
    return report


def remove_partial(path: Path) -> None:
    """Remove what a failed copy wrote at `path` (a directory whole, a file or a link as
    itself, never followed); nothing there is not an error."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode):
        fsdelete.remove_tree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _copy_tree_fds(sdir: int, ddir: int, skip: Skip, report: Tally, rel: str = "") -> None:
    """Depth-first copy of the directory `sdir` into `ddir` (`walk.Walk`, post-order for each
    directory's mode and times). Paths for `skip`, the report and errors are `rel` and below
    (an error names its path: `walk.named`)."""
    prefix = f"{rel}/" if rel else ""
    if skip is _never or not prefix:
        below = skip
    else:

        def below(r: str) -> bool:
            return skip(prefix + r)

    dests: list[tuple[int, os.stat_result | None]] = [(ddir, None)]
    try:
        for step in walk.Walk(sdir, walk.Policy(skip=_skipping(below), prefix=prefix, leave=True)):
            child = prefix + step.rel
            try:
                if step.kind == walk.ENTRY:
                    _copy_one(step, child, report, dests)
                elif step.kind == walk.MOUNT:
                    report.mounts.append(child)
                else:  # LEAVE: the directory is whole, its mode and times follow the source's
                    d, st = dests.pop()
                    assert st is not None
                    try:
                        os.fchmod(d, stat.S_IMODE(st.st_mode))
                        os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
                    finally:
                        os.close(d)
            except OSError as exc:
                raise walk.named(exc, child) from exc
    finally:
        for d, _st in dests[1:]:
            os.close(d)


def _copy_one(
    step: walk.Step, child: str, report: Tally, dests: list[tuple[int, os.stat_result | None]]
) -> None:
    """Copy one entry into the destination directory of its parent (`dests[-1]`); a
    directory is created there (or, merging, found) and its destination pushed on `dests`."""
    s, name, st = step.dir_fd, step.name, step.lstat()
    d = dests[-1][0]
    kind = special_type(st.st_mode)
    if kind is not None:
        report.special.append(Special(child, kind))
    elif step.fd is not None:
        try:
            os.mkdir(name, 0o700, dir_fd=d)
        except FileExistsError:
            pass  # merging into an existing directory (a restore)
        dests.append((os.open(name, _DIR_FLAGS, dir_fd=d), st))
    elif stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=s), name, dir_fd=d)
        os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=d, follow_symlinks=False)
        report.files.append(child)
    elif _copy_file(s, d, name, st, report=report):
        report.files.append(child)
        report.allocated += st.st_blocks * 512
    else:
        # Swapped for a special file between the lstat and the open: skipped too.
        now = os.stat(name, dir_fd=s, follow_symlinks=False)
        report.special.append(Special(child, special_type(now.st_mode) or "changed"))


def copy_file(src: Path, dest: Path) -> str | None:
    """Copy one file or symlink (never followed) to `dest` (which must not exist; its parent
    must), keeping holes. Returns the special type when `src` is a special file (nothing is
    copied); raises `disk_full` when it does not fit. A partial `dest` is removed."""
    st = os.lstat(src)
    kind = special_type(st.st_mode)
    if kind is not None:
        return kind
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(src))
    check_space(dest.parent, st.st_blocks * 512 if stat.S_ISREG(st.st_mode) else 0, 1, str(src))
    sdir = os.open(src.parent, _DIR_FLAGS)
    try:
        ddir = os.open(dest.parent, _DIR_FLAGS)
    except BaseException:
        os.close(sdir)
        raise
    try:
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(src.name, dir_fd=sdir), dest.name, dir_fd=ddir)
            return None
        if not _copy_file(sdir, ddir, src.name, st, dest.name):
            return special_type(os.lstat(src).st_mode) or "changed"
        return None
    finally:
        os.close(sdir)
        os.close(ddir)


def copy_entry_at(sdir: int, ddir: int, name: str, rel: str, *, skip: Skip, report: Tally) -> bool:
    try:
        return _copy_entry_at(sdir, ddir, name, rel, skip=skip, report=report)
    except OSError as exc:
        raise walk.named(exc, rel) from exc


def _copy_entry_at(sdir: int, ddir: int, name: str, rel: str, *, skip: Skip, report: Tally) -> bool:
    """Copy the entry `name` of the open directory `sdir` (a file, a symlink as a link, or a
    whole directory) into the open directory `ddir`, where it must not exist. `rel` is its path
    for `skip` and the report. Nothing is followed: `sdir` and `ddir` were opened with
    O_NOFOLLOW by the caller. The caller checks space (`check_space`) first and, on failure,
    removes the partial entry (it knows the destination's path). False when nothing was
    written: a special file, or a directory on another mount (both reported). An error names
    the path it is about (`rel` or below)."""
    st = os.stat(name, dir_fd=sdir, follow_symlinks=False)
    kind = special_type(st.st_mode)
    if kind is not None:
        report.special.append(Special(rel, kind))
        return False
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=sdir), name, dir_fd=ddir)
        os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=ddir, follow_symlinks=False)
        report.files.append(rel)
        return True
    if stat.S_ISREG(st.st_mode):
        if _copy_file(sdir, ddir, name, st, report=report):
            report.files.append(rel)
            report.allocated += st.st_blocks * 512
            return True
        now = os.stat(name, dir_fd=sdir, follow_symlinks=False)
        report.special.append(Special(rel, special_type(now.st_mode) or "changed"))
        return False
    sub = os.open(name, _DIR_FLAGS, dir_fd=sdir)
    try:
        if other_mount(sub, walk.mount_identity(sdir)):
            report.mounts.append(rel)
            return False
        os.mkdir(name, 0o700, dir_fd=ddir)
        dsub = os.open(name, _DIR_FLAGS, dir_fd=ddir)
        try:
            _copy_tree_fds(sub, dsub, skip, report, rel)
            os.fchmod(dsub, stat.S_IMODE(st.st_mode))
            os.utime(dsub, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(dsub)
    finally:
        os.close(sub)
    return True


def merge_dir_at(sdir: int, ddir: int, name: str, rel: str, *, skip: Skip, report: Tally) -> bool:
    try:
        return _merge_dir_at(sdir, ddir, name, rel, skip=skip, report=report)
    except OSError as exc:
        raise walk.named(exc, rel) from exc


def _merge_dir_at(sdir: int, ddir: int, name: str, rel: str, *, skip: Skip, report: Tally) -> bool:
    """Copy the directory `name` of `sdir` into the directory of the same name that `ddir`
    already has: subdirectories merge, and `skip` must leave out every file or link the
    destination has (a new file never replaces one: that is an error). Nothing is followed.
    False when `name` is on another mount (reported, not entered)."""
    sub = os.open(name, _DIR_FLAGS, dir_fd=sdir)
    try:
        if other_mount(sub, walk.mount_identity(sdir)):
            report.mounts.append(rel)
            return False
        dsub = os.open(name, _DIR_FLAGS, dir_fd=ddir)
        try:
            _copy_tree_fds(sub, dsub, skip, report, rel)
        finally:
            os.close(dsub)
    finally:
        os.close(sub)
    return True


def tally_at(sdir: int, name: str, skip: Skip = _never, rel: str | None = None) -> Tally:
    """What `copy_entry_at` of `name` in `sdir` would write (see `tally`). An error names the
    path it is about (`rel`, the entry's path for the caller, default `name`, or below)."""
    where = name if rel is None else rel
    try:
        return _tally_at(sdir, name, skip, where)
    except OSError as exc:
        raise walk.named(exc, where) from exc


def _tally_at(sdir: int, name: str, skip: Skip, where: str) -> Tally:
    found = Tally()
    st = os.stat(name, dir_fd=sdir, follow_symlinks=False)
    kind = special_type(st.st_mode)
    if kind is not None:
        found.special.append(Special(name, kind))
        return found
    found.entries += 1
    if stat.S_ISREG(st.st_mode):
        found.allocated += st.st_blocks * 512
        return found
    found.allocated += DIR_COST
    if not stat.S_ISDIR(st.st_mode):
        return found
    sub = os.open(name, _DIR_FLAGS, dir_fd=sdir)
    try:
        if other_mount(sub, walk.mount_identity(sdir)):
            return found
        _count_below(found, sub, skip, prefix=f"{where}/")
    finally:
        os.close(sub)
    return found
