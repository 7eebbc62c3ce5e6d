"""Who holds a root: the daemon's lock file read the way a second daemon would see it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

from xumd.system.rootlock import _read_holder


def read_holder(path: Path) -> dict[str, Any] | None:
    """The holding daemon's record (pid, start time), or None when no process holds the lock.
    A shared flock that succeeds proves nobody holds the exclusive one; the file's existence
    proves nothing (a crashed daemon leaves it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
