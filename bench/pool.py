"""The warm pool: `workspace.create` with `[create] pool = 1` (a ready checkout claimed) against
the same create without a pool and against `git worktree add -b`, on the synthetic monorepo
(`bench/monorepo.py`) of 10,000 and 100,000 files, all on one repository in the same run.

Each pooled create is timed only once its entry is ready (the refill runs in the background
between creates, untimed: that is the pool's point); `sync` before every timed call
(`bench.lifecycle.settle_disk`), and nothing of the run is deleted before the last measurement.

`python -m bench.pool [--sizes 10000,100000] [--repeats 5]`: p50 of each, and the ratios.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import time
from pathlib import Path

from bench import monorepo, procs, synth
from bench.lifecycle import _Xum, settle_disk

READY_TIMEOUT_S = 900.0


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


def _creates(repo: Path, root: Path, repeats: int, pool: bool) -> tuple[list[float], list[str]]:
    root.mkdir(parents=True, mode=0o700)
    if pool:
        (root / "config.toml").write_text("[create]\npool = 1\n")
    daemon = procs.xumd(root).start()
    xum = _Xum(daemon.socket_path)
    times: list[float] = []
    outcomes: list[str] = []
    try:
        project = xum.call("project.add", {"path": str(repo)})["project"]["id"]
        for i in range(repeats):
            if pool:
                _wait_ready(root)
            settle_disk()
            spent, made = xum.timed(
                "workspace.create", {"project_id": project, "name": f"{root.name}{i}"}
            )
            times.append(spent)
            outcomes.append(str(made.get("pool")))
    finally:
        xum.close()
        daemon.stop()
    return times, outcomes


def run_size(files: int, repeats: int) -> dict[str, float]:
    work = procs.short_dir("xbp-")
    repo = monorepo.make(work / "repo", files)
    git_times = []
    for i in range(repeats):
        settle_disk()
        started = time.perf_counter()
        synth.git(repo, "worktree", "add", "-q", "-b", f"g{i}", str(work / "git" / f"g{i}"))
        git_times.append(time.perf_counter() - started)
    try:
        plain, _ = _creates(repo, work / "plain", repeats, pool=False)
        pooled, outcomes = _creates(repo, work / "pooled", repeats, pool=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # after the last measurement
    assert set(outcomes) == {"hit"}, outcomes
    figures = {
        "git_ms": statistics.median(git_times) * 1000,
        "create_ms": statistics.median(plain) * 1000,
        "pooled_ms": statistics.median(pooled) * 1000,
    }
    figures["git_over_pooled"] = figures["git_ms"] / figures["pooled_ms"]
    figures["plain_over_pooled"] = figures["create_ms"] / figures["pooled_ms"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pool")
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for files in (int(s) for s in args.sizes.split(",")):
        f = run_size(files, args.repeats)
        print(
            f"{files:>7,} files: git worktree add p50 {f['git_ms']:8.1f} ms | create, no pool "
            f"{f['create_ms']:8.1f} ms | create, pool hit {f['pooled_ms']:7.1f} ms | "
            f"git/pooled {f['git_over_pooled']:5.1f}x | "
            f"no-pool/pooled {f['plain_over_pooled']:5.1f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
