"""Before a create writes anything: what it will write, against the disk budget (`[gc]`):
the free space of the filesystem it writes to (`min_free_bytes` / `min_free_percent`), the
root's bytes (`max_bytes`) and its project's workspaces (`max_workspaces`).

The estimate is the base's tree plus what `[create] copy` will copy from the main checkout (the
matching ignored entries, sized as the copy sizes them, up to `copy_max_bytes`). The tree:
`git ls-tree -r -l <commit>` sums its blobs' sizes (one run per commit, cached; bounded by the
git timeout), each blob rounded up to a 4 KiB block (a small file takes a block). A create
that takes a ready warm pool entry writes nothing new: it is not estimated; nor is any create
while no budget on bytes is set (`max_workspaces` alone: `sizes`). Checked only while a
budget is set: without one, a checkout that fills the disk fails as it writes and is undone
(tests/daemon/test_disk_full.py).

- Free space: `statvfs` of the filesystem, now.
- `max_bytes`: the root's bytes as `RootBytes` (lifecycle/rootbytes.py) figures them from gc's
  last measurement, the creates' reservations since and what the filesystems grew by since;
  measured by gc first when there is no recent measurement. A create that passes reserves its
  estimate there in the step that checked.
- `max_workspaces`: the project's workspaces that hold a checkout or will (`creating`,
  `active`, `archiving`, `restoring`, and `archived` with its checkout still on disk), plus
  this one. Counted again inside the intent row's transaction (`check_count`), so two
  creates at one place below the limit cannot both take it: the second is refused there.

Whatever lacks, the create first asks gc to make room (`MakeRoom`, a port the lifecycle defines
and gc implements: gc is the higher layer): what the budget's policy allows is collected
(surplus warm pool entries, idle workspaces' rebuildable directories, archived workspaces'
lingering checkouts, with `archive_idle_days` idle clean workspaces archived) and reclaimed at
once; gc measures the root again, every checkout walked anew, so a refusal never rests on the
cheap figure. The create proceeds when the budget then holds (its result lists what was
evicted); otherwise it is refused before its intent row: `disk_full` for bytes, naming the
filesystem or `max_bytes`, what it needs, what is free or held, what gc freed and what it left
alone; `conflict` for `max_workspaces`, naming the limit, the count and what could be freed
(an active workspace is never archived for it beyond `archive_idle_days`)."""

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
from xumd.lifecycle import rows, seed
from xumd.lifecycle.rootbytes import Figure, RootBytes
from xumd.lifecycle.rows import WorkspaceRow
from xumd.store import Store
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
    """gc as a create sees it: make room for `need` bytes at `path` (and, with `project_id`,
    for one more workspace of that project) now, as the budget's policy allows; measure the
    root now (recorded in `ledger`); and, after a create, check the budget in the background
    (bounded, coalesced)."""

    @property
    def ledger(self) -> RootBytes: ...

    async def make_room(self, path: Path, need: int, *, project_id: str | None = None) -> Made: ...

    async def measure_root(self) -> None: ...

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
class Need:
    """What a create is about to make: a checkout of about `bytes` (None: git could not say,
    or no budget on bytes is set; nothing measured against bytes) under `path`, one more
    workspace of `project_id`."""

    path: Path
    bytes: int | None
    project_id: str
    name: str


@dataclass(frozen=True, slots=True)
class Shortfall:
    fs: diskfull.Filesystem
    free: int
    keep: int


@dataclass(frozen=True, slots=True)
class OverBytes:
    figure: Figure
    limit: int


@dataclass(frozen=True, slots=True)
class OverCount:
    held: list[WorkspaceRow]
    most: int


Lack = Shortfall | OverBytes | OverCount

HOLDING = frozenset({"creating", "active", "archiving", "restoring"})
"""States whose workspace holds a checkout (or is about to); an archived one counts while its
checkout is still on disk."""


def holding(store: Store, project_id: str) -> list[WorkspaceRow]:
    """The project's workspaces counted against `max_workspaces` (gc's budget counts the same)."""
    return [
        r
        for r in rows.list_workspaces(store, project_id=project_id)
        if r.state in HOLDING or (r.state == "archived" and os.path.isdir(r.path))
    ]


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


def sizes(config: GcConfig) -> bool:
    """Whether a budget on bytes is set (free space or `max_bytes`): only then is what a create
    writes estimated (`max_workspaces` alone counts rows, never bytes)."""
    return bool(config.min_free_bytes or config.min_free_percent or config.max_bytes)


def figure_age(config: GcConfig) -> float:
    """How old gc's last measurement of the root may be for its figure to be used: its checks
    run every `budget_interval_s`; one missed is tolerated."""
    return 2 * config.budget_interval_s


async def _lacking(need: Need, config: GcConfig, room: MakeRoom, store: Store) -> list[Lack]:
    """What the budget lacks for `need`. Its awaits come first; from the count on it is one
    synchronous step, so a caller that reserves right after it decided on what it read."""
    max_age = figure_age(config)
    if config.max_bytes and need.bytes is not None and room.ledger.figure(max_age) is None:
        await room.measure_root()
    lacks: list[Lack] = []
    if config.max_workspaces:
        held = holding(store, need.project_id)
        if len(held) + 1 > config.max_workspaces:
            lacks.append(OverCount(held, config.max_workspaces))
    if need.bytes is None:
        return lacks
    short = shortfall(need.path, need.bytes, config)
    if short is not None:
        lacks.append(short)
    if config.max_bytes:
        figure = room.ledger.figure(max_age)
        if figure is None:
            log.info("workspace.root_bytes_unknown", max_bytes=config.max_bytes)
        elif figure.total + need.bytes > config.max_bytes:
            lacks.append(OverBytes(figure, config.max_bytes))
    return lacks


async def ensure(need: Need, config: GcConfig, what: str, room: MakeRoom, store: Store) -> Made:
    """Make sure the create keeps the budget: gc makes room first when it would not; refused
    (nothing written) when it still would not. What gc collected (empty: nothing was needed).
    A create that passes has its bytes reserved (`RootBytes`: against `max_bytes`, and for the
    warm pool's refill, which leaves them to it) in the step that checked."""
    lacks = await _lacking(need, config, room, store)
    if not lacks:
        _reserve(need, room)
        return Made()
    log.info(
        "workspace.create_making_room",
        path=str(need.path),
        need=need.bytes,
        lacking=[type(lack).__name__ for lack in lacks],
    )
    measured = room.ledger.measurements
    count = any(isinstance(lack, OverCount) for lack in lacks)
    made = await room.make_room(
        need.path, need.bytes or 0, project_id=need.project_id if count else None
    )
    fresh = room.ledger.measurements != measured
    lacks = await _lacking(need, config, room, store)
    if not fresh:
        # gc did not measure (no answer in time, or it failed): `max_bytes` is not refused on
        # the cheap figure alone.
        lacks = [lack for lack in lacks if not isinstance(lack, OverBytes)]
    if not lacks:
        _reserve(need, room)
        return made
    _refuse(need, lacks[0], what, made)
    return made  # pragma: no cover - _refuse raises


def _reserve(need: Need, room: MakeRoom) -> None:
    if need.bytes:
        room.ledger.reserve(need.project_id, need.name, need.bytes)


def check_count(store: Store, project_id: str, most: int) -> None:
    """Inside the intent row's transaction, the row inserted: refused `conflict` (the
    transaction rolls back) when the project now holds more than `most` (another create took
    the last place since this one was checked)."""
    if most <= 0:
        return
    held = holding(store, project_id)
    if len(held) > most:
        log.info("workspace.create_refused_count", project=project_id, held=len(held) - 1)
        raise XumError(
            ErrorKind.CONFLICT,
            f"the project already holds {len(held) - 1} workspace(s) with a checkout, and "
            f"[gc] max_workspaces is {most}: another create took the last place while this "
            "one was checked; nothing was made (archive or remove a workspace, or raise "
            "max_workspaces)",
            project_id=project_id,
            max_workspaces=most,
            workspaces=len(held) - 1,
        )


def _refuse(need: Need, lack: Lack, what: str, made: Made) -> None:
    freed = sum(d.bytes for d in made.evicted)
    tried = (
        f"; gc freed {freed} bytes ({len(made.evicted)} item(s)) and could free no more"
        if made.evicted
        else "; gc found nothing it may collect"
    )
    if made.note:
        tried = f"; {made.note}"
    held = f" (left alone: {'; '.join(made.held[:5])})" if made.held else ""
    if isinstance(lack, OverCount):
        _refuse_count(need, lack, made, held)
    if isinstance(lack, OverBytes):
        figure = lack.figure
        log.info("workspace.create_refused_budget", max_bytes=lack.limit, root=figure.total)
        raise XumError(
            ErrorKind.DISK_FULL,
            f"the root cannot take {what}: it needs about {need.bytes} bytes, the root holds "
            f"{figure.total} bytes ({figure.describe()}) and [gc] max_bytes is {lack.limit}"
            f"{tried}{held}; nothing was written (`xum gc --dry-run` shows what gc could free)",
            path=str(need.path),
            need_bytes=need.bytes,
            max_bytes=lack.limit,
            root_bytes=figure.total,
            freed_bytes=freed,
        )
    assert isinstance(lack, Shortfall)
    fs, keep = lack.fs, lack.keep
    log.info(
        "workspace.create_refused_budget", filesystem=fs.mount, need=need.bytes, free=lack.free
    )
    kept = f" and keep {keep} bytes free ([gc] min_free_*)" if keep else ""
    raise XumError(
        ErrorKind.DISK_FULL,
        f"{fs.describe()} cannot take {what}: it needs about {need.bytes} bytes{kept}, and "
        f"{lack.free} bytes are free{tried}{held}; nothing was written (`xum gc --dry-run` "
        "shows what gc could free)",
        path=str(need.path),
        need_bytes=need.bytes,
        keep_bytes=keep,
        freed_bytes=freed,
        **fs.data(),
    )


def _refuse_count(need: Need, lack: OverCount, made: Made, held: str) -> None:
    lingering = [r.name for r in lack.held if r.state == "archived"]
    could = (
        f"; archived with their checkout still on disk (their cleanup failing): "
        f"{', '.join(lingering)}"
        if lingering
        else ""
    )
    collected = f"; gc collected {len(made.evicted)} item(s)" if made.evicted else ""
    log.info("workspace.create_refused_count", project=need.project_id, held=len(lack.held))
    raise XumError(
        ErrorKind.CONFLICT,
        f"the project holds {len(lack.held)} workspace(s) with a checkout and [gc] "
        f"max_workspaces is {lack.most}{collected}{could}{held}; nothing was made (archive or "
        "remove a workspace, or raise max_workspaces; `xum gc --dry-run` shows what gc could "
        "free)",
        project_id=need.project_id,
        max_workspaces=lack.most,
        workspaces=len(lack.held),
        lingering=lingering,
        collected=len(made.evicted),
    )
