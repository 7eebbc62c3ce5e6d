"""Deleting a trash entry: bottom-up, never following a symlink, counting the bytes freed.

Runs in a worker thread (a checkout of 100k files takes seconds to minutes); a `stop` event lets
shutdown interrupt it between two entries. What is left is deleted by the next attempt.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from pathlib import Path


class Interrupted(Exception):
    pass


def _unlink(path: str) -> int:
    st = os.lstat(path)
    size = st.st_size if stat.S_ISREG(st.st_mode) else 0
    try:
        os.unlink(path)
    except PermissionError:
        # A read-only parent (some package caches make directories 0555): make it writable.
        parent = os.path.dirname(path)
        os.chmod(parent, stat.S_IMODE(os.lstat(parent).st_mode) | stat.S_IWUSR | stat.S_IXUSR)
        os.unlink(path)
    return size


def delete_tree(top: Path, stop: threading.Event) -> int:
    """Delete `top` (a real directory, checked by the caller) and everything below it."""
    freed = 0
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(os.lstat(top).st_mode)
        os.chmod(top, mode | stat.S_IRWXU)
    # First pass, top-down: make every directory readable, writable and searchable so the
    # deleting pass can enter and empty it. os.walk with followlinks=False lists a symlink to a
    # directory among `dirs` but never descends into it; it is unlinked like a file below.
    for current, dirs, _files in os.walk(top, topdown=True, followlinks=False):
        if stop.is_set():
            raise Interrupted
        for name in dirs:
            full = os.path.join(current, name)
            with contextlib.suppress(OSError):
                st = os.lstat(full)
                if stat.S_ISDIR(st.st_mode):
                    os.chmod(full, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
    # Second pass, bottom-up: files, then the emptied directories.
    for current, dirs, files in os.walk(top, topdown=False, followlinks=False):
        for name in files:
            if stop.is_set():
                raise Interrupted
            with contextlib.suppress(FileNotFoundError):
                freed += _unlink(os.path.join(current, name))
        for name in dirs:
            full = os.path.join(current, name)
            with contextlib.suppress(FileNotFoundError):
                if os.path.islink(full):
                    freed += _unlink(full)
                else:
                    os.rmdir(full)
    os.rmdir(top)
    return freed
