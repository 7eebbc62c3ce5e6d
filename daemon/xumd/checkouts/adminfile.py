"""Reading one of git's worktree admin files (`.git/worktrees/<name>/gitdir`, `locked`): what
proves an admin entry ours before cleanup or an unarchive drops it.

The repository is the user's: such a file may be missing, a symlink, a named pipe (a plain
`open()` would wait for a writer in the event loop's thread), a device or huge. Any of those is
"unreadable" (None), which never proves the entry ours: the entry is left alone.
"""

from __future__ import annotations

import errno
from pathlib import Path

from xumd.base import logs
from xumd.system import smallfile

log = logs.get("xumd.checkouts.adminfile")

ADMIN_FILE_MAX = 16384  # pragma: no mutate (the tests pin the bound relative to the constant)
"""More than a `gitdir` (a path, at most PATH_MAX) or a lock reason line can hold."""


def read_admin_file(path: Path) -> str | None:
    """The file's text, or None when it is missing, a symlink (never followed), not a regular
    file (never blocked on) or larger than `ADMIN_FILE_MAX`."""
    try:
        raw = smallfile.read_regular(path, ADMIN_FILE_MAX, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            log.warning("checkouts.admin_file_unreadable", path=str(path), error=exc.strerror)
        return None
    return raw.decode("utf-8", errors="replace")
