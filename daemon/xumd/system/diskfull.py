"""A full filesystem is its own error kind: `disk_full`, naming the filesystem and what was not
written, instead of an `internal` error (SQLite's "database or disk is full", an OSError with
ENOSPC) or an `operation_failed` that quotes git's "unable to write file" without saying why.

No space, no inodes (both are ENOSPC) and a reached quota (EDQUOT) are the same thing to the
user: free something on that filesystem. The error is raised where the write failed, before
anything was committed (the store rolls its transaction back; callers undo their effects), so
the answer is always "nothing was changed"."""

from __future__ import annotations

import errno
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from xum_protocol.errors import ErrorKind

from xumd.base.errors import XumError
from xumd.system.platform import current

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

# What git prints when a write fails for lack of space. It does not always add the errno text:
# a checkout that fills the disk says only "unable to write file X" (entry.c, a short write
# after the file was created), and the index "unable to write new index file".
GIT_NO_SPACE_MARKERS = (
    "no space left on device",
    "disk quota exceeded",
    "unable to write file",
    "unable to write new index file",
    "short write",
)


@dataclass(frozen=True, slots=True)
class Filesystem:
    """The filesystem a path is on, as the user would look it up (`df PATH`)."""

    mount: str
    fstype: str | None
    free_bytes: int | None
    free_inodes: int | None

    def describe(self) -> str:
        return f"the filesystem mounted at {self.mount}" + (
            f" ({self.fstype})" if self.fstype else ""
        )

    def free(self) -> str:
        parts = []
        if self.free_bytes is not None:
            parts.append(f"{self.free_bytes} bytes")
        if self.free_inodes is not None:
            parts.append(f"{self.free_inodes} inodes")
        return f"; free now: {' and '.join(parts)}" if parts else ""

    def data(self) -> dict[str, object]:
        return {
            "filesystem": self.mount,
            "fstype": self.fstype,
            "free_bytes": self.free_bytes,
            "free_inodes": self.free_inodes,
        }


def _existing(path: Path) -> Path:
    """`path` or its nearest existing ancestor (what is written may not exist yet)."""
    current = Path(os.path.abspath(path))
    while not os.path.lexists(current) and current != current.parent:
        current = current.parent
    return current


def _mount_point(path: Path) -> Path:
    current = Path(os.path.realpath(_existing(path)))
    try:
        dev = current.stat().st_dev
    except OSError:
        return current
    while current != current.parent:
        try:
            if current.parent.stat().st_dev != dev:
                break
        except OSError:
            break
        current = current.parent
    return current


def _fstype(mount: Path) -> str | None:
    """The type of the filesystem mounted at `mount` (the last mount there wins, as in the
    kernel's view); None when the mount table cannot be read."""
    try:
        table = current().mount_table()
    except OSError:
        return None
    found: str | None = None
    for point, fstype in table:
        if point == str(mount) and fstype is not None:
            found = fstype
    return found


def filesystem_of(path: Path | str) -> Filesystem:
    mount = _mount_point(Path(path))
    try:
        vfs = os.statvfs(mount)
    except OSError:
        return Filesystem(str(mount), _fstype(mount), None, None)
    return Filesystem(
        str(mount),
        _fstype(mount),
        vfs.f_bavail * vfs.f_frsize,
        vfs.f_favail if vfs.f_files else None,
    )


def disk_full(
    path: Path | str, what: str, cause: str | None = None, *, others: tuple[Path | str, ...] = ()
) -> XumError:
    """`disk_full` naming the filesystem of `path` and `what` was not written. With `others`
    (where else the failed step wrote), the fullest of them all is named: a failed step may
    have freed what it wrote by the time we look, so the ranking is a best guess."""
    candidates = {f.mount: f for f in map(filesystem_of, (path, *others))}
    fs = min(
        candidates.values(),
        key=lambda f: (f.free_inodes != 0, f.free_bytes if f.free_bytes is not None else 1 << 62),
    )
    because = f" ({cause})" if cause else ""
    return XumError(
        ErrorKind.DISK_FULL,
        f"{fs.describe()} is full (no space or no inodes left): {what} was not written"
        f"{because}{fs.free()}; free space there and retry",
        path=str(path),
        **fs.data(),
    )


def is_no_space_oserror(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS


def is_sqlite_full(exc: BaseException) -> bool:
    """SQLite's SQLITE_FULL (an extended code keeps the primary code in its low byte)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return (
        isinstance(exc, sqlite3.Error)
        and isinstance(code, int)
        and code & 0xFF == sqlite3.SQLITE_FULL
    )


def git_says_no_space(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in GIT_NO_SPACE_MARKERS)


def from_oserror(exc: OSError, what: str | None = None) -> XumError:
    """`disk_full` for an OSError with ENOSPC/EDQUOT, naming the file it was about."""
    # A copy or a move names its source first and its destination second (shutil sets both
    # on ENOSPC): the destination is what could not be written.
    target = next(
        (name for name in (exc.filename2, exc.filename) if isinstance(name, str | Path)), None
    )
    if target is None:
        return XumError(
            ErrorKind.DISK_FULL,
            f"no space left on a filesystem the daemon writes to: {what or 'a file'} was not "
            f"written ({exc.strerror or exc}); free space and retry",
        )
    return disk_full(target, what or str(target), exc.strerror or None)


UNWRITABLE_ERRNOS = frozenset({errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM})
"""What the machine refuses (a read-only or failing filesystem, permissions): an external step
that failed, not a bug in the daemon."""


def from_exception(exc: BaseException) -> XumError | None:
    """`disk_full` for an exception that says the disk is full; `operation_failed` naming the
    file and its filesystem for one the machine refused (read-only, I/O error, permission);
    else None (an unexpected error stays `internal`)."""
    if (
        isinstance(exc, OSError)
        and exc.errno in UNWRITABLE_ERRNOS
        and isinstance(exc.filename, str | Path)
    ):
        fs = filesystem_of(exc.filename)
        return XumError(
            ErrorKind.OPERATION_FAILED,
            f"{exc.filename}: {exc.strerror} (on {fs.describe()})",
            path=str(exc.filename),
            filesystem=fs.mount,
            errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
        )
    if is_no_space_oserror(exc):
        assert isinstance(exc, OSError)
        return from_oserror(exc)
    if is_sqlite_full(exc):
        return XumError(
            ErrorKind.DISK_FULL,
            "no space left on the filesystem of the state database: the change was not "
            "written (SQLite: database or disk is full); free space there and retry",
        )
    return None
