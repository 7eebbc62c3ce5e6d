"""An entry as it was made ready, so that a claim proves it unchanged without a `git status`
(whose untracked walk reads every directory: ~0.3 s at 100,000 files).

Taken once the preparation's own `git status` found the entry clean: every directory's
`st_mtime_ns` (a file or directory made, removed or renamed anywhere changes its parent's), and
the worktree's index file (ino, size, mtime: a `git add` rewrites it). A claim then lstats those
directories and the index, reads the detached `HEAD` from git's admin dir, and runs
`git diff-files --quiet` for edits in place (git's stat test of every tracked file against the
index the preparation refreshed). Any difference is a changed entry (stale). Kept in memory: an
entry made before the daemon's start has none, and its claim runs the full `git status`.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import anyio

from xumd.checkouts.adminfile import read_admin_file
from xumd.system.git import Git


@dataclass(frozen=True, slots=True)
class Stamps:
    dirs: dict[str, int]
    """Each directory's path (the entry's own, before any move) -> st_mtime_ns."""
    index: tuple[int, int, int]


def _index(admin: Path) -> tuple[int, int, int]:
    st = os.lstat(admin / "index")
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def take(top: Path, admin: Path) -> Stamps:
    """Every directory of the checkout (never following a symlink). In a worker thread."""
    dirs: dict[str, int] = {}
    pending = [str(top)]
    while pending:
        where = pending.pop()
        dirs[where] = os.lstat(where).st_mtime_ns
        with os.scandir(where) as entries:
            pending.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
    return Stamps(dirs, _index(admin))


def changed(admin: Path, stamps: Stamps) -> str | None:
    """Why the checkout is not as stamped (None: as stamped). In a worker thread."""
    try:
        if _index(admin) != stamps.index:
            return "its index changed"
        for where, mtime in stamps.dirs.items():
            st = os.lstat(where)
            if not stat.S_ISDIR(st.st_mode) or st.st_mtime_ns != mtime:
                return f"{where} changed"
    except OSError as exc:
        return f"cannot stat it: {exc.strerror}"
    return None


async def check(
    git: Git, top: Path, admin: Path, stamps: Stamps, *, commit: str, timeout_s: float
) -> str | None:
    """None when the entry is as stamped at `commit`; else why not (the module's checks)."""
    head = (read_admin_file(admin / "HEAD") or "").strip()
    if head != commit:
        return f"its HEAD is {head or 'unreadable'}, not {commit}"
    found: list[str | None] = [None, None]

    async def directories() -> None:
        found[0] = await anyio.to_thread.run_sync(changed, admin, stamps)

    async def files() -> None:
        edited = await git.run(top, "diff-files", "--quiet", timeout_s=timeout_s, check=False)
        if edited.returncode == 1 and not edited.timed_out:
            found[1] = "a tracked file was edited"
        elif not edited.ok:
            found[1] = f"its files are unknown ({edited.describe()})"

    # The directories' lstats and git's stat test of every file are independent: side by side.
    async with anyio.create_task_group() as tg:
        tg.start_soon(directories)
        tg.start_soon(files)
    return found[0] or found[1]
