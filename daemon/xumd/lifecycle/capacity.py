"""Before a create writes anything: what it will write, against the free space and the disk
budget (`[gc] min_free_bytes` / `min_free_percent`) of the filesystem it writes to.

The estimate is the base's tree: `git ls-tree -r -l <commit>` sums its blobs' sizes (one run
per commit, cached; bounded by the git timeout), each blob rounded up to a 4 KiB block (a small
file takes a block). A create that would leave less free than the budget keeps is refused
`disk_full` before its intent row, naming the filesystem, what it needs, what is free, and
where to look (`xum gc --dry-run`: what evicting idle workspaces' rebuildable directories would
free). Checked only while a budget is set: without one, a checkout that fills the disk fails as
it writes and is undone (tests/daemon/test_disk_full.py)."""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

from xum_protocol.errors import ErrorKind

from xumd.base import logs
from xumd.base.config import GcConfig
from xumd.base.errors import XumError
from xumd.lifecycle import seed
from xumd.system import diskfull
from xumd.system.git import Git

log = logs.get("xumd.lifecycle.capacity")

BLOCK = 4096
CACHED = 64
_sizes: OrderedDict[str, int] = OrderedDict()


async def tree_bytes(git: Git, repo: Path, commit: str) -> int | None:
    """The bytes a checkout of `commit` writes (blocks), or None when git cannot say."""
    if commit in _sizes:
        _sizes.move_to_end(commit)
        return _sizes[commit]
    try:
        entries = await seed.git_list(
            git, repo, ["ls-tree", "-r", "-l", "-z", commit], what=f"the tree of {commit[:12]}"
        )
    except XumError as exc:
        log.info("workspace.tree_size_unknown", commit=commit, error=exc.message)
        return None
    total = 0
    for entry in entries:
        fields = entry.split(None, 4)
        if len(fields) >= 4 and fields[1] == "blob" and fields[3].isdigit():
            total += -(-int(fields[3]) // BLOCK) * BLOCK
    _sizes[commit] = total
    while len(_sizes) > CACHED:
        _sizes.popitem(last=False)
    return total


def check(path: Path, need: int, config: GcConfig, what: str) -> None:
    """Refuse `disk_full` when writing `need` bytes at `path` would leave less free than the
    budget keeps (or than nothing)."""
    fs = diskfull.filesystem_of(path)
    if fs.free_bytes is None:
        return
    keep = config.min_free_bytes
    if config.min_free_percent:
        try:
            vfs = os.statvfs(fs.mount)
            keep = max(keep, int(vfs.f_blocks * vfs.f_frsize * config.min_free_percent / 100))
        except OSError:
            pass
    if fs.free_bytes - need >= keep:
        return
    log.info("workspace.create_refused_budget", filesystem=fs.mount, need=need, free=fs.free_bytes)
    kept = f" and keep {keep} bytes free ([gc] min_free_*)" if keep else ""
    raise XumError(
        ErrorKind.DISK_FULL,
        f"{fs.describe()} cannot take {what}: it needs about {need} bytes{kept}, and "
        f"{fs.free_bytes} bytes are free; nothing was written (`xum gc --dry-run` shows what "
        "evicting idle workspaces' rebuildable directories would free)",
        path=str(path),
        need_bytes=need,
        keep_bytes=keep,
        **fs.data(),
    )
