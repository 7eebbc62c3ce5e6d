"""Reading a small file that someone else may have replaced (the user's config, git's admin
files, an index header): never blocking, never without bound.

A plain `open()` of a named pipe for reading waits for a writer, in whatever thread opened it
(the event loop's: the whole daemon); a device or a huge file would be read without end. The
open here never blocks (O_NONBLOCK), anything but a regular file is refused, and so is more
than `limit` bytes.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def _open_regular(path: Path | str, follow_symlinks: bool) -> int:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    fd = os.open(path, flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return fd


def read_regular(path: Path | str, limit: int, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of the regular file at `path`, at most `limit`; an OSError for anything else
    (EINVAL: not a regular file; EFBIG: larger than `limit`; ELOOP: a symlink, when not
    followed), as for a missing file."""
    fd = _open_regular(path, follow_symlinks)
    try:
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, min(1 << 16, limit + 1)):
            total += len(chunk)
            if total > limit:
                raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_head(path: Path | str, size: int) -> bytes:
    """The first `size` bytes (fewer if it is shorter) of the regular file at `path`; an
    OSError for anything that is not one."""
    fd = _open_regular(path, True)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)
