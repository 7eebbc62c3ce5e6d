"""One usage walk: allocated bytes (st_blocks * 512), each inode once, never across a mount
(`system/walk.py`: by descriptor, so a path longer than PATH_MAX counts too), the ignored
share, the largest top-level entries; stops at a deadline and then says the figures are a lower
bound, as it does when an entry or a directory cannot be read. Runs in a worker thread:
nothing here awaits."""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field

from xum_protocol.models.usage import DirUsage, UsageFigures

from xumd.system import fsdelete
from xumd.system import walk as treewalk

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_EVERY = 4096
"""Entries between two looks at the clock (and one at every directory)."""

LARGEST = 10


@dataclass(slots=True)
class _Totals:
    bytes: int = 0
    apparent: int = 0
    files: int = 0
    ignored_bytes: int = 0
    ignored_files: int = 0
    top: dict[str, int] = field(default_factory=dict)
    seen: set[tuple[int, int]] = field(default_factory=set)

    def add(self, st: os.stat_result, rel_top: str | None, *, ignored: bool, is_dir: bool) -> None:
        if st.st_nlink > 1 and not is_dir:
            key = (st.st_dev, st.st_ino)
            if key in self.seen:
                return  # a hard link already counted: its blocks are on disk once
            self.seen.add(key)
        allocated = st.st_blocks * 512
        self.bytes += allocated
        if not is_dir:
            self.files += 1
            self.apparent += st.st_size
        if ignored:
            self.ignored_bytes += allocated
            if not is_dir:
                self.ignored_files += 1
        if rel_top is not None:
            self.top[rel_top] = self.top.get(rel_top, 0) + allocated


def walk(top: str, deadline: float, ignored: frozenset[str] = frozenset()) -> UsageFigures:
    """Walk `top` until `deadline` (time.monotonic). `ignored`: relative paths (files or
    directories, no trailing slash) that git ignores; everything under one counts as ignored."""
    totals = _Totals()
    complete = True
    error: str | None = None
    try:
        root_st = os.lstat(top)
    except OSError as exc:
        return UsageFigures(bytes=0, apparent_bytes=0, files=0, complete=False, error=str(exc))
    if not stat.S_ISDIR(root_st.st_mode):
        # A symlink (or anything else) where the tree was: never followed, never walked.
        return UsageFigures(
            bytes=0, apparent_bytes=0, files=0, complete=False, error=f"{top} is not a directory"
        )
    totals.add(root_st, None, ignored=False, is_dir=True)
    try:
        mounts = [p for p in fsdelete.mounts_at_or_under(top) if p != os.path.realpath(top)]
    except OSError:
        mounts = []
    try:
        top_fd = os.open(top, _DIR_FLAGS)
    except OSError as exc:
        return UsageFigures(bytes=0, apparent_bytes=0, files=0, complete=False, error=str(exc))
    unread: list[str] = []

    def failed(rel: str, exc: OSError) -> None:
        unread.append(f"{rel or '.'}: {exc.strerror or exc}")

    # Mount ids only where the table shows a mount below (st_dev is compared everywhere).
    # Files first: a hard link counts at the name met first directory by directory.
    policy = treewalk.Policy(sort=False, files_first=True, mount_ids=bool(mounts), errors=failed)
    ignored_dirs: set[str] = set()
    try:
        for count, step in enumerate(treewalk.Walk(top_fd, policy)):
            if (step.fd is not None or count % _EVERY == 0) and time.monotonic() > deadline:
                complete, error = False, "the walk hit its deadline (usage.deadline_s)"
                break
            if step.kind != treewalk.ENTRY:
                continue  # a mount: not the checkout's
            rel = step.rel
            is_dir = step.fd is not None
            is_ignored = rel in ignored or (
                bool(ignored_dirs) and rel.rpartition("/")[0] in ignored_dirs
            )
            if is_dir and is_ignored:
                ignored_dirs.add(rel)
            totals.add(step.lstat(), rel.partition("/")[0], ignored=is_ignored, is_dir=is_dir)
    finally:
        os.close(top_fd)
    if unread and complete:
        complete, error = False, unread[-1]
    largest = sorted(totals.top.items(), key=lambda kv: (-kv[1], kv[0]))[:LARGEST]
    return UsageFigures(
        bytes=totals.bytes,
        apparent_bytes=totals.apparent,
        files=totals.files,
        ignored_bytes=totals.ignored_bytes,
        ignored_files=totals.ignored_files,
        largest=[DirUsage(path=p, bytes=b) for p, b in largest],
        complete=complete,
        error=error,
        mounts_skipped=mounts[:20],
    )


def empty() -> UsageFigures:
    return UsageFigures(bytes=0, apparent_bytes=0, files=0)
