"""Before a create writes anything: what it will write, against the free space and the disk
budget (`[gc] min_free_bytes` / `min_free_percent`) of the filesystem it writes to.

The estimate is the base's tree plus what `[create] copy` will copy from the main checkout (the
matching ignored entries, sized as the copy sizes them, up to `copy_max_bytes`). The tree:
`git ls-tree -r -l <commit>` sums its blobs' sizes (one run per commit, cached; bounded by the
git timeout), each blob rounded up to a 4 KiB block (a small file takes a block). A create
that would leave less free than the budget keeps is refused `disk_full` before its intent row,
naming the filesystem, what it needs, what is free, what gc freed and what it left alone, and
where to look (`xum gc --dry-run`). Checked only while a budget is set: without one, a checkout
that fills the disk fails as it writes and is undone (tests/daemon/test_disk_full.py).

Before refusing, the create asks gc to make room (`MakeRoom`, a port the lifecycle defines and
gc implements: gc is the higher layer): what the budget's policy allows is collected (surplus
warm pool entries, idle workspaces' rebuildable directories, archived workspaces' lingering
checkouts, with `archive_idle_days` idle clean workspaces archived) and reclaimed at once, and
the create proceeds when the space is then there; its result lists what was evicted. A create
that takes a ready warm pool entry writes nothing new: it is not estimated."""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.gc import GcDone

from xumd.base import logs
from xumd.base.config import GcConfig
from xumd.base.errors import XumError
from xumd.lifecycle import seed
from xumd.system import diskfull, fscopy
from xumd.system.git import Git

log = logs.get("xumd.lifecycle.capacity")

BLOCK = 4096
CACHED = 64
_sizes: OrderedDict[str, int] = OrderedDict()


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


async def copy_bytes(git: Git, repo: Path, patterns: list[str], cap: int) -> int:
    """The allocated bytes `[create] copy` would copy from `repo` (at most `cap`); 0 when git
    cannot list them (the copy then reports its own failure)."""
    if not patterns:
        return 0
    try:
        entries = await seed.matching(git, repo, patterns)
    except XumError:
        return 0
    return await anyio.to_thread.run_sync(_tally, repo, entries, cap) if entries else 0


def _tally(repo: Path, entries: list[str], cap: int) -> int:
    total = 0
    try:
        root = os.open(repo, _DIR_FLAGS)
    except OSError:
        return 0
    try:
        for entry in entries:
            parts = entry.rstrip("/").split("/")
            try:
                parent = fscopy.open_parents(root, parts)
            except OSError:
                continue  # a symlink on its path, or gone: the copy skips it too
            try:
                total += fscopy.tally_at(parent, parts[-1]).allocated
            except OSError:
                continue
            finally:
                os.close(parent)
            if total >= cap:
                return cap
    finally:
        os.close(root)
    return total


@dataclass(slots=True)
class Made:
    """What gc collected to make room, and what it could not touch."""

    evicted: list[GcDone] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    """The largest holders left alone (busy, unsaved, a mount), each with why."""
    note: str | None = None
    """Why nothing could be tried (gc unavailable, no answer in time)."""


class MakeRoom(Protocol):
    """gc as a create sees it: make room for `need` bytes at `path` now, as the budget's policy
    allows; and, after a create, check the budget in the background (bounded, coalesced)."""

    async def make_room(self, path: Path, need: int) -> Made: ...

    def created(self) -> None: ...


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


@dataclass(frozen=True, slots=True)
class Shortfall:
    fs: diskfull.Filesystem
    free: int
    keep: int


def shortfall(path: Path, need: int, config: GcConfig) -> Shortfall | None:
    """What writing `need` bytes at `path` lacks against the budget's free space (or nothing),
    or None when it fits (or the free space cannot be read)."""
    fs = diskfull.filesystem_of(path)
    if fs.free_bytes is None:
        return None
    keep = config.min_free_bytes
    if config.min_free_percent:
        try:
            vfs = os.statvfs(fs.mount)
            keep = max(keep, int(vfs.f_blocks * vfs.f_frsize * config.min_free_percent / 100))
        except OSError:
            pass
    if fs.free_bytes - need >= keep:
        return None
    return Shortfall(fs, fs.free_bytes, keep)


async def ensure(path: Path, need: int, config: GcConfig, what: str, room: MakeRoom) -> Made:
    """Make sure writing `need` bytes at `path` keeps the budget: gc makes room first when it
    would not; refused `disk_full` (nothing written) when it still would not. What gc collected
    (empty: nothing was needed)."""
    short = shortfall(path, need, config)
    if short is None:
        return Made()
    log.info("workspace.create_making_room", filesystem=short.fs.mount, need=need)
    made = await room.make_room(path, need)
    short = shortfall(path, need, config)
    if short is None:
        return made
    _refuse(path, need, short, what, made)
    return made  # pragma: no cover - _refuse raises


def _refuse(path: Path, need: int, short: Shortfall, what: str, made: Made) -> None:
    fs, keep = short.fs, short.keep
    log.info("workspace.create_refused_budget", filesystem=fs.mount, need=need, free=short.free)
    kept = f" and keep {keep} bytes free ([gc] min_free_*)" if keep else ""
    freed = sum(d.bytes for d in made.evicted)
    tried = (
        f"; gc freed {freed} bytes ({len(made.evicted)} item(s)) and could free no more"
        if made.evicted
        else "; gc found nothing it may collect"
    )
    if made.note:
        tried = f"; {made.note}"
    held = f" (left alone: {'; '.join(made.held[:5])})" if made.held else ""
    raise XumError(
        ErrorKind.DISK_FULL,
        f"{fs.describe()} cannot take {what}: it needs about {need} bytes{kept}, and "
        f"{short.free} bytes are free{tried}{held}; nothing was written (`xum gc --dry-run` "
        "shows what gc could free)",
        path=str(path),
        need_bytes=need,
        keep_bytes=keep,
        freed_bytes=freed,
        **fs.data(),
    )
