"""The warm pool: `workspace.create` with `[create] pool = 1` (a ready checkout claimed) and the
same create without a pool, each against `git worktree add -b`, on the synthetic monorepo
(`bench/monorepo.py`) of 10,000 and 100,000 files, all on one repository in the same run.

Two daemons serve the repository side by side (one root with a pool, one without), so each
repetition times the three in turn, the order rotating by repetition, `sync` before each
(`bench.lifecycle.settle_disk`). A pooled create is timed only once its entry is ready, and the
refill it starts is waited for before anything else is timed (the refill runs between creates,
untimed: that is the pool's point). Nothing of the run is deleted before the last measurement;
the first repetition warms the page cache and is not recorded.

Figures (bench/targets.py): a hit against git (at least 10x faster), the same values' p50 in
milliseconds (within 0.3 s), and the create without a pool against git (within 1.1x).

`python -m bench.pool [--sizes 10000,100000] [--repeats 5] [--json PATH]`.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench import monorepo, procs, report, synth
from bench.lifecycle import served, settle_disk
from bench.stats import Figure

READY_TIMEOUT_S = 900.0
ADD = "git worktree add -b (same repository)"


def _ready(root: Path) -> bool:
    db = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT COUNT(*) FROM pool_entries WHERE state = 'ready'").fetchone()
    finally:
        db.close()
    return bool(row[0])


def _wait_ready(root: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _ready(root):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no pool entry became ready within {READY_TIMEOUT_S}s")
        time.sleep(0.05)


def run_size(files: int, repeats: int) -> list[Figure]:
    tag = f"{files:,} files"
    hit = Figure("pool", f"workspace.create, pool hit ({tag})", "ms", ADD)
    hit_p50 = Figure("pool", f"workspace.create, pool hit, p50 ({tag})", "ms", ADD)
    plain = Figure("pool", f"workspace.create, no pool ({tag})", "ms", ADD)
    work = procs.short_dir("xbp-")
    try:
        repo = monorepo.make(work / "repo", files)
        pooled_root, plain_root = work / "pooled", work / "plain"
        pooled_root.mkdir(mode=0o700)
        (pooled_root / "config.toml").write_text("[create]\npool = 1\n")
        with served(pooled_root) as pooled_xum, served(plain_root) as plain_xum:
            pooled_project = pooled_xum.call("project.add", {"path": str(repo)})["project"]["id"]
            plain_project = plain_xum.call("project.add", {"path": str(repo)})["project"]["id"]
            for rep in range(repeats + 1):  # rep 0 warms the page cache, not recorded
                target = str(work / "git" / f"g{rep}")
                steps: dict[str, Callable[[], Any]] = {
                    "git": partial(
                        synth.git, repo, "worktree", "add", "-q", "-b", f"g{rep}", target
                    ),
                    "plain": partial(
                        plain_xum.call,
                        "workspace.create",
                        {"project_id": plain_project, "name": f"p{rep}"},
                    ),
                    "pooled": partial(
                        pooled_xum.call,
                        "workspace.create",
                        {"project_id": pooled_project, "name": f"h{rep}"},
                    ),
                }
                names = list(steps)
                times: dict[str, float] = {}
                answers: dict[str, Any] = {}
                for name in names[rep % 3 :] + names[: rep % 3]:
                    _wait_ready(pooled_root)  # no refill runs while anything is timed
                    settle_disk()
                    started = time.perf_counter()
                    answers[name] = steps[name]()
                    times[name] = time.perf_counter() - started
                _wait_ready(pooled_root)
                made = answers["pooled"]
                if (made.get("pool"), made.get("materialised")) != ("hit", "pool"):
                    raise RuntimeError(f"a pooled create was not a hit: {made.get('pool')}")
                if rep:
                    hit.add(times["pooled"] * 1000, times["git"] * 1000)
                    hit_p50.add(times["pooled"] * 1000, times["git"] * 1000)
                    plain.add(times["plain"] * 1000, times["git"] * 1000)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # after the last measurement
    return [hit, hit_p50, plain]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pool", description=__doc__)
    parser.add_argument("--sizes", default="10000,100000", help="tracked files, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="recorded repetitions")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the figures")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    figures: list[Figure] = []
    for files in sizes:
        figures.extend(run_size(files, args.repeats))
    title = f"warm pool ({', '.join(f'{n:,}' for n in sizes)} files, {args.repeats} repetitions"
    report.emit(title, figures, {"sizes": sizes, "repeats": args.repeats}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
