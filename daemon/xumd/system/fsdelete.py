"""Filesystem boundaries for every destructive step: mount detection and one deletion primitive.

A directory bind-mounted inside a checkout (a shared cache, a dataset, a home folder) is not the
checkout's: deleting the checkout must never descend into it. Two layers keep that:

- **Detection** (`mounts_at_or_under`): the mount table (the platform's: Linux
  `/proc/self/mountinfo`, elsewhere psutil's partitions, `all=True`) names every mount
  point at or below a path. Structural operations refuse `busy` with a `mount` holder, the trash
  step waits, and a reclaim stays pending naming the mount, all before anything is deleted.
- **The walk itself** (`delete_tree`): deletion goes by file descriptor (`openat` with
  `O_NOFOLLOW | O_DIRECTORY`, `unlinkat`), never by path, so a rename or a symlink swapped in
  mid-walk cannot redirect it. Every directory it opens is compared with the top by `st_dev` and
  by mount id (`/proc/self/fdinfo`: a bind mount of the same filesystem has the same `st_dev`).
  One on another device or mount is never entered and never removed; it is reported in
  `DeleteReport.left`, and the directories above it stay. The detection above cannot close the
  window between its check and the walk; this check can, because it looks at the opened
  directory itself.

Hard links: a file's bytes count as freed only when its last link goes (`st_nlink == 1`); the
other links (inside or outside the tree) keep their data, since unlinking one name never touches
another.

On the portable backend the walk compares `st_dev` only (no mount ids); on macOS and the BSDs a
mount always has its own device, and the mount table names every mount point.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from xumd.system import walk
from xumd.system.platform import current, linux
from xumd.system.walk import mount_id, mount_identity, named

# Linux's mount table text, for the trash area's mount ids (only Linux has them).
MOUNTINFO = linux.MOUNTINFO
decode_mount_field = linux.decode_mount_field
parse_mount_table = linux.parse_mount_table
_PROC_FD = "/proc/self/fd/{fd}"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Interrupted(Exception):
    """The `stop` event was set: the walk stopped between two entries (resumable)."""


# -- the mount table ---------------------------------------------------------------------------


def mount_points() -> list[str]:
    """Every mount point this process sees (the platform's mount table: Linux mountinfo,
    elsewhere psutil's partitions, all of them). An error reading it raises (callers fail
    closed)."""
    return [point for point, _fstype in current().mount_table()]


def mounts_at_or_under(path: Path | str) -> list[str]:
    """Mount points at `path` itself or below it (canonical spelling), in table order without
    duplicates. The table spells paths canonically, so `path` is resolved first; a mount on a
    symlink's target is then found under the link's spelling too."""
    real = os.path.realpath(path)
    prefix = real.rstrip("/") + "/"
    found: list[str] = []
    for point in mount_points():
        if (point == real or point.startswith(prefix)) and point not in found:
            found.append(point)
    return found


def mounts_below(top: Path | str) -> bool:
    """Whether the mount table names a mount strictly below `top`: a walk then reads every
    directory's mount id (`walk.Policy.mount_ids`; st_dev alone misses a bind mount of the
    same filesystem). True when the table cannot be read (fail closed)."""
    real = os.path.realpath(top)
    try:
        return any(point != real for point in mounts_at_or_under(real))
    except OSError:
        return True


def describe_mounts(points: list[str]) -> str:
    shown = ", ".join(points[:5])
    return shown + (f" (and {len(points) - 5} more)" if len(points) > 5 else "")


# -- identity of an open directory -------------------------------------------------------------


def same_mount(a: Path, b: Path) -> bool:
    """Whether two existing directories sit on one mount (a rename between them cannot fail
    with EXDEV). `st_dev` alone cannot tell: two bind mounts of one filesystem share it."""
    fds: list[int] = []
    try:
        for path in (a, b):
            fds.append(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        first = mount_identity(fds[0])
        if first != mount_identity(fds[1]):
            return False
    finally:
        for fd in fds:
            os.close(fd)
    if first[1] is not None:
        return True
    # No mount ids (the portable backend): the mount table's deepest point above each.
    try:
        return mount_point_of(a) == mount_point_of(b)
    except OSError:
        return False  # cannot tell: never a rename that could fail with EXDEV


def _mounted_below(top: Path) -> frozenset[tuple[int, int]]:
    """(st_dev, st_ino) of the root of each mount the table names strictly below `top`: what a
    directory opened there is when it is such a mount. For a backend without mount ids, whose
    `st_dev` alone misses a bind mount of the same filesystem. The table unreadable raises."""
    real = os.path.realpath(top)
    found: set[tuple[int, int]] = set()
    for point in mounts_at_or_under(real):
        if point != real:
            with contextlib.suppress(OSError):
                st = os.stat(point)
                found.add((st.st_dev, st.st_ino))
    return frozenset(found)


def _refusing(
    opener: Callable[[str, int], int], mounted: frozenset[tuple[int, int]]
) -> Callable[[str, int], int]:
    """`opener`, refusing (`walk.OtherMount`) a directory that is the root of a mount in
    `mounted`."""
    if not mounted:
        return opener

    def open_dir(name: str, dir_fd: int) -> int:
        fd = opener(name, dir_fd)
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) in mounted:
            os.close(fd)
            raise walk.OtherMount
        return fd

    return open_dir


def mount_point_of(path: Path) -> str:
    """The deepest mount point of the table at or above `path` (canonical). The table
    unreadable raises."""
    real = os.path.realpath(path)
    above = [p for p in mount_points() if real == p or real.startswith(p.rstrip("/") + "/")]
    return max(above, key=len, default="/")


# -- deletion ----------------------------------------------------------------------------------


@dataclass(slots=True)
class DeleteReport:
    freed: int = 0
    left: list[str] = field(default_factory=list)
    """Absolute paths left alone: mount points and directories or files on another device (the
    directories above them are kept too)."""

    @property
    def complete(self) -> bool:
        return not self.left


def _writable(fd: int) -> None:
    """Make an open directory readable, writable and searchable for its owner (some package
    caches make directories 0555: their entries could not be unlinked otherwise)."""
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    if mode & stat.S_IRWXU != stat.S_IRWXU:
        os.fchmod(fd, mode | stat.S_IRWXU)


def _open_dir(name: str, dir_fd: int) -> int:
    """Open a subdirectory without following a symlink; one that denies us reading is made
    readable first, through a path-only descriptor (chmod of the exact inode, not of a name a
    rename could swap), and only when it sits on its parent's mount (`walk.OtherMount`
    otherwise)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        if current().mount_id(dir_fd) is None:
            # No mount ids (nor /proc/self/fd to reopen a path descriptor through): st_dev.
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if st.st_dev != os.fstat(dir_fd).st_dev:
                raise walk.OtherMount from None
            os.chmod(name, stat.S_IRWXU, dir_fd=dir_fd, follow_symlinks=False)
            return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    pfd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st, parent = os.fstat(pfd), os.fstat(dir_fd)
        if st.st_dev != parent.st_dev or mount_id(pfd) != mount_id(dir_fd):
            raise walk.OtherMount
        mode = stat.S_IMODE(st.st_mode)
        os.chmod(_PROC_FD.format(fd=pfd), mode | stat.S_IRWXU)
        return os.open(_PROC_FD.format(fd=pfd), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    finally:
        os.close(pfd)


def _remove(name: str, dir_fd: int, *, directory: bool) -> None:
    """unlinkat (AT_REMOVEDIR for a directory); a read-only parent is made writable first."""
    remove = os.rmdir if directory else os.unlink
    try:
        remove(name, dir_fd=dir_fd)
    except PermissionError:
        _writable(dir_fd)
        remove(name, dir_fd=dir_fd)


def delete_tree(top: Path, stop: threading.Event | None = None) -> DeleteReport:
    """Delete the directory `top` and everything below it that sits on top's own mount.

    `top` must be a real directory (a symlink there raises, unfollowed) on the same mount as its
    parent: one that is itself a mount point is left whole and reported. Mount points and other
    devices below are never entered nor removed; they and their ancestors stay, listed in the
    report's `left`. Raises `Interrupted` when `stop` is set (what is left is deleted by the next
    call), `Moved` when a directory of the walk was moved elsewhere meanwhile, `OSError` on other
    errors."""
    stop = stop or threading.Event()
    report = DeleteReport()
    parent_fd = os.open(top.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            top_fd = _open_dir(top.name, parent_fd)
        except walk.OtherMount:
            report.left.append(str(top))
            return report
        try:
            if mount_identity(parent_fd) != mount_identity(top_fd):
                report.left.append(str(top))
                return report
            policy = _DELETE
            if mount_id(top_fd) is None:
                # No mount ids to tell a bind mount of this filesystem by (the portable
                # backend): the mounts the table names below, read again as the walk starts.
                policy = replace(_DELETE, open=_refusing(_open_dir, _mounted_below(top)))
            _delete_below(top_fd, str(top), report, stop, policy)
        finally:
            os.close(top_fd)
        if report.complete:
            with contextlib.suppress(FileNotFoundError):
                _remove(top.name, parent_fd, directory=True)
    finally:
        os.close(parent_fd)
    return report


_DELETE = walk.Policy(sort=False, leave=True, open=_open_dir, prepare=_writable)
"""Post-order (a directory goes once emptied), in listing order, every directory's mount id
read (the walk itself is the last check before a removal), unreadable directories made
readable when they are ours."""


def _delete_below(
    top_fd: int, top: str, report: DeleteReport, stop: threading.Event, policy: walk.Policy
) -> None:
    steps = walk.Walk(top_fd, policy)
    for step in steps:
        if stop.is_set():
            raise Interrupted
        try:
            if step.kind == walk.ENTRY:
                if step.fd is None:
                    _delete_entry(steps, step, top, report)
            elif step.kind == walk.MOUNT:
                report.left.append(os.path.join(top, step.rel))
            elif not step.held:  # LEAVE: what is below was left alone, this stays too
                _remove_emptied(steps, step, top, report)
        except OSError as exc:
            raise named(exc, step.rel) from exc


def _delete_entry(steps: walk.Walk, step: walk.Step, top: str, report: DeleteReport) -> None:
    """Remove a file, a link or a special file (never opened)."""
    st = step.lstat()
    if st.st_dev != steps.dev:
        report.left.append(os.path.join(top, step.rel))  # a file bind-mounted from elsewhere
        steps.hold()
        return
    try:
        _remove(step.name, step.dir_fd, directory=False)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno == errno.EISDIR:
            steps.again(step.name)  # swapped for a directory meanwhile: look again
            return
        if exc.errno != errno.EBUSY:
            raise
        report.left.append(os.path.join(top, step.rel))  # bind-mounted from this filesystem
        steps.hold()
        return
    if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
        report.freed += st.st_size


def _remove_emptied(steps: walk.Walk, step: walk.Step, top: str, report: DeleteReport) -> None:
    try:
        _remove(step.name, step.dir_fd, directory=True)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        report.left.append(os.path.join(top, step.rel))  # became a mount point once emptied
        steps.hold()


def remove_tree(path: Path, *, ignore_errors: bool = False) -> list[str]:
    """`delete_tree` for a path that may be absent (the daemon's own stale `.tmp` leftovers,
    archive copies, process directories): returns what was left alone (mounts; `[]` when
    nothing was there). With `ignore_errors`, an `OSError` leaves the rest for the next call
    (what `shutil.rmtree(..., ignore_errors=True)` did, minus crossing into mounts)."""
    try:
        return delete_tree(path).left
    except FileNotFoundError:
        return []
    except OSError:
        if not ignore_errors:
            raise
        return []


def walk_within(top: Path) -> Iterator[tuple[str, list[str], list[str]]]:
    """`os.walk(top)` (top-down, symlinks not followed) by descriptor (`walk.Walk`), never into
    another mount: one on another device, or (where the mount table shows a mount below) with
    another mount id, is not entered. `dirs` names a directory's subdirectories as os.walk
    does (a link to a directory among them, never entered), a mount among them too; removing a
    name from it leaves that directory unwalked. A directory that cannot be read is passed by.
    For the usage walks (file lists, stray counts): what sits on a mount is not the checkout's,
    so it is neither counted nor listed. A `top` that is a symlink is not walked."""
    try:
        top_fd = os.open(top, _DIR_FLAGS)
    except OSError:
        return
    policy = walk.Policy(
        sort=False, stat=False, listings=True, mount_ids=mounts_below(top), errors=_passed_by
    )
    if mount_id(top_fd) is None:
        try:
            policy = replace(policy, open=_refusing(walk.open_dir, _mounted_below(top)))
        except OSError:
            pass  # no table: st_dev alone (a size count, nothing is deleted)
    try:
        for step in walk.Walk(top_fd, policy):
            if step.kind != walk.LISTED:
                continue
            dirs: list[str] = []
            files: list[str] = []
            for entry in step.entries:
                (dirs if _is_dir(entry) else files).append(entry.name)
            yield os.path.join(top, step.rel) if step.rel else str(top), dirs, files
            walked = set(dirs)
            step.entries[:] = [e for e in step.entries if e.name in walked]
    finally:
        os.close(top_fd)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    """As os.walk sorts an entry: a link to a directory counts as one."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _passed_by(_rel: str, _exc: OSError) -> None:
    """What a usage walk cannot read is passed by, as os.walk does."""
