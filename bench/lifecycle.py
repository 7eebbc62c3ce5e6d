"""Lifecycle figures on identical synthetic repositories: workspace.create vs bare
`git worktree add -b`; workspace.archive vs `git worktree remove --force` and vs that plus a
bare snapshot (`git stash create`, then `git add -A` on a temporary index, write-tree,
commit-tree); workspace.remove vs `git worktree remove --force`."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from bench import procs, synth
from bench.client import Conn
from bench.settings import Settings
from bench.stats import Figure

ADD = "git worktree add -b (identical repository)"
REMOVE = "git worktree remove --force"
SNAP_REMOVE = "git stash create + git add -A on a temp index + commit-tree, then " + REMOVE

T = TypeVar("T")


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def paired(rep: int, mine: Callable[[], T], floor: Callable[[], object]) -> tuple[float, T, float]:
    """One repetition of a figure: `settle_disk`, then xum's side and the floor's, each timed
    (seconds), xum's first on an even `rep` and the floor's first on an odd one, so neither
    side always runs in the other's wake. Returns (xum's time, what xum's side returned, the
    floor's time)."""
    settle_disk()
    if rep % 2 != 0:
        floor_s = _timed(floor)
    started = time.perf_counter()
    result = mine()
    mine_s = time.perf_counter() - started
    if rep % 2 == 0:
        floor_s = _timed(floor)
    return mine_s, result, floor_s


def floor_snapshot(checkout: Path, ref: str) -> None:
    """What a minimal tool must do to save staged, unstaged and untracked work without touching
    the user's index or stash: the same result xum's snapshot commit gives."""
    synth.git(checkout, "stash", "create")
    index = Path(
        synth.git(checkout, "rev-parse", "--path-format=absolute", "--git-path", "index").strip()
    )
    with tempfile.NamedTemporaryFile(dir=index.parent, prefix="bench-index") as tmp:
        shutil.copyfile(index, tmp.name)
        env = {"GIT_INDEX_FILE": tmp.name}
        synth.git(checkout, "add", "-A", env=env)
        tree = synth.git(checkout, "write-tree", env=env).strip()
    commit = synth.git(checkout, "commit-tree", tree, "-p", "HEAD", "-m", "snapshot").strip()
    synth.git(checkout, "update-ref", ref, commit)


def settle_disk() -> None:
    """Before a measured create: write back what earlier steps left dirty (`sync`), so that
    neither side of a pair pays for the other's writeback.

    The order of the phases matters more on an ext4 without a journal (this machine's root
    filesystem: "mounted filesystem ... without journal" in the kernel log): there an inode
    deleted less than 60 s ago (300 s while its inode-table block is dirty) is not reused, and
    every inode allocation steps past each such inode of its group, one buffer-cache lookup
    apiece (`recently_deleted()` in fs/ext4/ialloc.c). A `git worktree add` of 2,000 files
    just after a few thousand deletions spends seconds of system time there against ~0.1 s
    without them (docs/PERFORMANCE.md, "Why create's figure spread"); so every create is
    measured before anything of the run is deleted."""
    os.sync()


def _wait_trash_empty(root: Path, timeout: float = 300.0) -> None:
    """Background reclaim (deleting trashed checkouts) must not overlap the next measurement."""
    trash = root / "trash"
    deadline = time.monotonic() + timeout
    while trash.exists() and any(trash.iterdir()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"reclaim of {trash} did not finish within {timeout}s")
        time.sleep(0.05)


class _Xum:
    def __init__(self, sock: Path) -> None:
        self.sock = sock
        self.loop = asyncio.new_event_loop()
        self.conn: Conn = self.loop.run_until_complete(Conn.open(sock, hello=True))

    def call(self, method: str, params: dict[str, Any]) -> Any:
        return self.loop.run_until_complete(self.conn.call(method, params))

    def timed(self, method: str, params: dict[str, Any]) -> tuple[float, Any]:
        started = time.perf_counter()
        result = self.call(method, params)
        return time.perf_counter() - started, result

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()


@contextmanager
def against_git(work: Path, template: Path) -> Iterator[tuple[_Xum, str, Path, Path]]:
    """Two identical copies of the repository `template` under `work`: xum's, a project of a
    daemon on `work/root`, and the floor's, with an empty directory for its worktrees. Yields
    (the client, the project's id, the floor's repository, its worktrees' directory)."""
    xrepo = synth.copy(template, work / "xrepo")
    frepo = synth.copy(template, work / "frepo")
    floor_dir = work / "floor-wt"
    floor_dir.mkdir()
    with served(work / "root") as xum:
        project = xum.call("project.add", {"path": str(xrepo)})["project"]["id"]
        yield xum, project, frepo, floor_dir


@contextmanager
def served(root: Path) -> Iterator[_Xum]:
    """A daemon on `root` and a connection to it, both stopped at the end."""
    daemon = procs.xumd(root).start()
    try:
        xum = _Xum(daemon.socket_path)
        try:
            yield xum
        finally:
            xum.close()
    finally:
        daemon.stop()


def _sizes(settings: Settings) -> list[tuple[str, int]]:
    sizes = [("small", settings.small_files)]
    if settings.large:
        sizes.append(("large", settings.large_files))
    return sizes


def run(settings: Settings) -> list[Figure]:
    figures: list[Figure] = []
    for label, files in _sizes(settings):
        figures.extend(_run_size(settings, label, files))
    return figures


def _run_size(settings: Settings, label: str, files: int) -> list[Figure]:
    tag = f"{label} repo, {files:,} files"
    create = Figure("lifecycle", f"workspace.create ({tag})", "ms", ADD)
    archive = Figure("lifecycle", f"workspace.archive, dirty, vs remove ({tag})", "ms", REMOVE)
    archive_snap = Figure(
        "lifecycle", f"workspace.archive, dirty, vs snapshot+remove ({tag})", "ms", SNAP_REMOVE
    )
    remove = Figure("lifecycle", f"workspace.remove, clean ({tag})", "ms", REMOVE)
    # The same remove until its background reclaim has deleted the checkout (the deletion
    # git's remove does before it returns): not a target, what the deferral hides.
    reclaimed = Figure(
        "lifecycle", f"workspace.remove, clean, until reclaimed ({tag})", "ms", REMOVE
    )
    work = procs.short_dir("xbl-")
    root = work / "root"
    try:
        # The template stays until the end: deleting its files here would put thousands of
        # recently deleted inodes in the way of the first creates (see `settle_disk`).
        template = synth.make_template(work / "template", files)
        with against_git(work, template) as (xum, project, frepo, floor_dir):
            names = [f"b{rep + 1}" if rep >= 0 else "warm" for rep in range(-1, settings.repeats)]
            # Phase 1, every create (nothing is deleted between them): rep -1 warms the page
            # cache and is not recorded; each also makes the clean pair that phase 2 removes.
            made: dict[str, tuple[str, Path, Path, str]] = {}
            for rep, name in enumerate(names, start=-1):
                fpath = floor_dir / name
                add = ["worktree", "add", "-q", "-b", f"floor/{name}", str(fpath), "HEAD"]
                x_create, ws, f_create = paired(
                    rep,
                    partial(xum.call, "workspace.create", {"project_id": project, "name": name}),
                    partial(synth.git, frepo, *add),
                )
                clean = xum.call("workspace.create", {"project_id": project, "name": f"c{name}"})
                synth.git(
                    frepo,
                    "worktree",
                    "add",
                    "-q",
                    "-b",
                    f"floor/c{name}",
                    str(floor_dir / f"c{name}"),
                )
                xpath = Path(ws["workspace"]["path"])
                made[name] = (ws["workspace"]["id"], xpath, fpath, clean["workspace"]["id"])
                if rep >= 0:
                    create.add(x_create * 1000, f_create * 1000)
            # Phase 2, archive and remove (their deletions come after every create was measured).
            for rep, name in enumerate(names, start=-1):
                ws_id, xpath, fpath, clean_id = made[name]
                settle_disk()  # both sides delete checkouts whose files reached the disk
                synth.dirty(xpath)
                synth.dirty(fpath)
                f_snap = _timed(partial(floor_snapshot, fpath, f"refs/bench/{name}"))
                f_remove = _timed(
                    partial(synth.git, frepo, "worktree", "remove", "--force", str(fpath))
                )
                x_archive, _ = xum.timed("workspace.archive", {"workspace_id": ws_id})
                _wait_trash_empty(root)
                f_rm_clean = _timed(
                    partial(
                        synth.git,
                        frepo,
                        "worktree",
                        "remove",
                        "--force",
                        str(floor_dir / f"c{name}"),
                    )
                )
                x_remove, _ = xum.timed("workspace.remove", {"workspace_id": clean_id})
                x_reclaimed = _timed(partial(_wait_trash_empty, root))
                if rep < 0:
                    continue
                archive.add(x_archive * 1000, f_remove * 1000)
                archive_snap.add(x_archive * 1000, (f_snap + f_remove) * 1000)
                remove.add(x_remove * 1000, f_rm_clean * 1000)
                reclaimed.add((x_remove + x_reclaimed) * 1000, f_rm_clean * 1000)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [create, archive, archive_snap, remove, reclaimed]
