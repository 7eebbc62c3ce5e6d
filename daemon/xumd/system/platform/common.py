"""What both backends share: the "could not look" errnos and the answer of a path probe."""

from __future__ import annotations

import errno
from typing import NamedTuple

EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""accept/open errors that mean "out of descriptors or kernel memory": transient, back off. The
one "could not look" set: a read of a process or of the mount table that fails with one of these
raises instead of concluding "no such process" or "nobody holds it" (fail closed)."""


def is_exhausted(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in EXHAUSTED


class PathUser(NamedTuple):
    """A process whose cwd or an open regular file lies under a path."""

    pid: int
    name: str
    since: float
    where: str
    """"cwd" or "open file"."""
    argv: list[str]


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


ZOMBIE_STATES = ("Z", "X")
"""State letters (as /proc/PID/stat writes them) of a process that has ended."""
