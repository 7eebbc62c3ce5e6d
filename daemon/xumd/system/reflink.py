"""Copy-on-write clones of a directory tree: every regular file shares its source's extents
(FICLONE), so a checkout of any size is made in one pass of metadata operations, without
reading or writing its data. Where the filesystem cannot (ext4, across filesystems) nothing is
cloned and the caller lets git write the checkout.

The walk is system/walk.py's (by descriptor, never following a symlink, never entering another
mount). Every file's data must be cloned: a file that would have to be copied is `NotCloneable`
(a clone that silently turns into a copy costs what git's checkout costs, plus ours). Each
file keeps its source's mode and times (an old mtime also keeps git from treating the entry as
racily clean), a symlink is made with the same target, a directory with the same mode. A
special file or another mount in the source is `NotCloneable` too: a checkout has neither.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable, Container
from pathlib import Path

from xumd.system import walk
from xumd.system.fscopy import FICLONE

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_NO_CLONE = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS}
_PROBE = ".xum-reflink-probe"
_PROBE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

Check = Callable[[str, os.stat_result], None]
"""Called with each source file or link (path relative to the top, its lstat) before it is
cloned; raises to stop the clone (the caller's test that the source is what it expects)."""


class NotCloneable(Exception):
    """The tree cannot be cloned here (the reason is the message); nothing the caller asked
    for is wrong, git writes the checkout instead."""


Cloned = dict[str, os.stat_result]
"""The lstat of each file and link made, by path relative to the top."""


def supported(src: Path, dest_dir: Path) -> bool:
    """Whether files of `src` can be cloned into `dest_dir`: one filesystem, and it shares
    extents (probed with a one-byte file cloned inside `dest_dir`, both removed)."""
    try:
        if os.stat(src).st_dev != os.stat(dest_dir).st_dev:
            return False
    except OSError:
        return False
    first, second = dest_dir / f"{_PROBE}.{os.getpid()}", dest_dir / f"{_PROBE}.{os.getpid()}.c"
    try:
        a = os.open(first, _PROBE_FLAGS, 0o600)
        try:
            os.write(a, b"x")
            b = os.open(second, _WRITE_FLAGS, 0o600)
            try:
                fcntl.ioctl(b, FICLONE, a)
            finally:
                os.close(b)
        finally:
            os.close(a)
        return True
    except OSError:
        return False
    finally:
        first.unlink(missing_ok=True)
        second.unlink(missing_ok=True)


def clone_tree(
    src: Path, dest: Path, *, leave_out: Container[str] = frozenset(), check: Check | None = None
) -> Cloned:
    """Clone the entries of `src` into the existing directory `dest` (which must not hold any
    of them), leaving out the paths in `leave_out` (relative to `src`). On an error what was
    made is left for the caller to take back with the checkout."""
    done: Cloned = {}
    src_fd = os.open(src, _DIR_FLAGS)
    try:
        dest_fd = os.open(dest, _DIR_FLAGS)
        dests: list[tuple[int, os.stat_result | None]] = [(dest_fd, None)]
        try:
            policy = walk.Policy(sort=False, leave=True, leave_out=leave_out, mount_ids=False)
            for step in walk.Walk(src_fd, policy):
                try:
                    _one(step, dests, done, check)
                except OSError as exc:
                    raise walk.named(exc, step.rel) from exc
        finally:
            for d, _st in reversed(dests):
                os.close(d)
    finally:
        os.close(src_fd)
    return done


def _one(
    step: walk.Step,
    dests: list[tuple[int, os.stat_result | None]],
    done: Cloned,
    check: Check | None,
) -> None:
    if step.kind == walk.MOUNT:
        raise NotCloneable(f"{step.rel} is another mount")
    if step.kind == walk.LEAVE:
        d, st = dests.pop()
        assert st is not None
        try:
            os.fchmod(d, stat.S_IMODE(st.st_mode))
        finally:
            os.close(d)
        return
    st, d, name = step.lstat(), dests[-1][0], step.name
    if step.fd is not None:
        os.mkdir(name, 0o700, dir_fd=d)
        dests.append((os.open(name, _DIR_FLAGS, dir_fd=d), st))
        return
    if check is not None:
        check(step.rel, st)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=step.dir_fd), name, dir_fd=d)
        os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=d, follow_symlinks=False)
        done[step.rel] = os.stat(name, dir_fd=d, follow_symlinks=False)
        return
    if not stat.S_ISREG(st.st_mode):
        raise NotCloneable(f"{step.rel} is a special file")
    done[step.rel] = _clone_file(step.dir_fd, d, name, st)


def _clone_file(sdir: int, ddir: int, name: str, st: os.stat_result) -> os.stat_result:
    src = os.open(name, _READ_FLAGS, dir_fd=sdir)
    try:
        now = os.fstat(src)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(now.st_mode):
            raise NotCloneable(f"{name} changed during the clone")
        dst = os.open(name, _WRITE_FLAGS, 0o600, dir_fd=ddir)
        try:
            try:
                fcntl.ioctl(dst, FICLONE, src)
            except OSError as exc:
                if exc.errno in _NO_CLONE:
                    raise NotCloneable(f"the filesystem does not clone {name}: {exc}") from None
                raise
            os.fchmod(dst, stat.S_IMODE(now.st_mode))
            os.utime(dst, ns=(now.st_atime_ns, now.st_mtime_ns))
            return os.fstat(dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)
