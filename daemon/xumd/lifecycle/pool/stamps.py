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
    """Each directory's path relative to the checkout ("" the top) -> st_mtime_ns."""
    index: tuple[int, int, int]


def _index(admin: Path) -> tuple[int, int, int]:
    st = os.lstat(admin / "index")
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def take(top: Path, admin: Path) -> Stamps:
    """Every directory of the checkout (never following a symlink). In a worker thread."""
    dirs: dict[str, int] = {}
    pending = [""]
    while pending:
        rel = pending.pop()
        where = os.path.join(top, rel) if rel else str(top)
        dirs[rel] = os.lstat(where).st_mtime_ns
        with os.scandir(where) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(os.path.join(rel, entry.name) if rel else entry.name)
    return Stamps(dirs, _index(admin))


def changed(top: Path, admin: Path, stamps: Stamps) -> str | None:
    """Why the checkout is not as stamped (None: as stamped). In a worker thread."""
    try:
        if _index(admin) != stamps.index:
            return "its index changed"
        for rel, mtime in stamps.dirs.items():
            st = os.lstat(os.path.join(top, rel) if rel else top)
            if not stat.S_ISDIR(st.st_mode) or st.st_mtime_ns != mtime:
                return f"{rel or '.'} changed"
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
    why = await anyio.to_thread.run_sync(changed, top, admin, stamps)
    if why is not None:
        return why
    edited = await git.run(top, "diff-files", "--quiet", timeout_s=timeout_s, check=False)
    if edited.returncode == 1 and not edited.timed_out:
        return "a tracked file was edited"
    if not edited.ok:
        return f"its files are unknown ({edited.describe()})"
    return None
