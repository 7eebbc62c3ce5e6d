"""Replacing a small file whole or not at all: a temporary file in the same directory, written,
fsynced, renamed over the target.

A reader (or a crash) sees the old content or the new, never a part: the rename is atomic and the
temporary file's content is on disk before it. What survives a power loss once the call has
returned is the caller's to state (`durable`): the rename itself is on disk only once its
directory is fsynced too, which costs a second flush that a file rebuilt at the next start does
not need.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

_TRIES = 100  # pragma: no mutate (a collision is one in 2^32 per try)


def write_atomic(
    path: Path, data: bytes, *, durable: bool, mode: int = 0o644, temp_name: str | None = None
) -> None:
    """Make `path` hold `data`, whole or not at all; on any failure the old file (or its
    absence) is left and the temporary file is removed.

    `durable`: True, the new content survives a power loss once this returns (the directory is
    fsynced after the rename); False, a power loss may bring back the old content, never a part
    of either (the file is fsynced before the rename, not the directory after it).
    `mode` is the new file's, less the umask. `temp_name`: a fixed name for the temporary file,
    for a writer that holds a lock on the directory's files (a crash's leftover is then the next
    write's to reuse, and others can skip it by name); None, a fresh name no other writer has.
    A symlink is never followed at the temporary name."""
    directory = path.parent
    tmp, fd = _create(directory, path.name, mode, temp_name)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:  # pragma: no mutate (a failure either way, the target untouched)
            pass
        raise
    if durable:
        dirfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)


def _create(directory: Path, name: str, mode: int, temp_name: str | None) -> tuple[Path, int]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    if temp_name is not None:
        tmp = directory / temp_name
        return tmp, os.open(tmp, flags | os.O_TRUNC, mode)
    for _ in range(_TRIES):
        # Hidden, and named after its target, so a listing shows whose leftover it is.
        # Not mutated: only how unlikely a retried collision is.
        tmp = directory / f".{name}.{secrets.token_hex(4)}.tmp"  # pragma: no mutate
        try:
            return tmp, os.open(tmp, flags | os.O_EXCL, mode)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {directory / name}")
