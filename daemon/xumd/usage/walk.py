"""One usage walk: allocated bytes (st_blocks * 512), each inode once, never across a mount
(`fsdelete.walk_within`), the ignored share, the largest top-level entries; stops at a deadline
and then says the figures are a lower bound. Runs in a worker thread: nothing here awaits."""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from xum_protocol.models.usage import DirUsage, UsageFigures

from xumd.system import fsdelete

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
    dir_ignored: dict[str, bool] = {"": False}
    top_path = os.fspath(top)
    for current, dirs, files in fsdelete.walk_within(Path(top_path)):
        if time.monotonic() > deadline:
            complete, error = False, "the walk hit its deadline (usage.deadline_s)"
            break
        rel_dir = os.path.relpath(current, top_path)
        rel_dir = "" if rel_dir == "." else rel_dir
        here_ignored = dir_ignored.get(rel_dir, False)
        for name in [*dirs, *files]:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            try:
                st = os.lstat(os.path.join(current, name))
            except FileNotFoundError:
                continue  # gone meanwhile: nothing to count
            except OSError as exc:
                complete, error = False, f"{rel}: {exc.strerror}"
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            is_ignored = here_ignored or rel in ignored
            if is_dir:
                dir_ignored[rel] = is_ignored
            totals.add(st, rel.split("/", 1)[0], ignored=is_ignored, is_dir=is_dir)
        dir_ignored.pop(rel_dir, None)
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
