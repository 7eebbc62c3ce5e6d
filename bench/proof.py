"""The proof on the bytes (daemon/xumd/lifecycle/onbytes.py): what it costs on a checkout of N
files made by `workspace.create`, against `git status` of the same checkout (the view it
completes), measured in the same run.

    .venv/bin/python -m bench.proof [--files 100000] [--repeats 5]

Prints the medians and the ratio; the checkout is a real worktree of a synthetic repository
(bench/synth.py), made through the daemon's API, with ten edits git sees."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from xumd.lifecycle import onbytes
from xumd.lifecycle.snapshot import Snapshotter
from xumd.system.git import Git

from bench import synth
from tests.support.daemon import DaemonProcess


def _prove(checkout: Path, scratch: Path, tree: str) -> onbytes.Account:
    """As an archive proves: against the snapshot's work tree, with git's ignored listing."""
    snapshots = Snapshotter(Git(), scratch / "tmp", scratch / "archive")
    return asyncio.run(snapshots.prove(checkout, tree, None))


def _work_tree(checkout: Path, scratch: Path) -> str:
    """The snapshot's work tree (written once: what an archive's capture writes first)."""
    snapshots = Snapshotter(Git(), scratch / "tmp", scratch / "archive")
    return asyncio.run(snapshots.capture(checkout)).work_tree


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.proof")
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="xum-proof-"))
    try:
        repo = synth.make_template(base / "repo", args.files)
        daemon = DaemonProcess(base / "root").start()
        try:
            project = daemon.call("project.add", {"path": str(repo)})["project"]
            ws = daemon.call("workspace.create", {"project_id": project["id"], "name": "bench"})[
                "workspace"
            ]
            checkout = Path(ws["path"])
            synth.dirty(checkout)
            tree = _work_tree(checkout, base)
            proof, status = [], []
            for _ in range(args.repeats):
                t = time.perf_counter()
                acc = _prove(checkout, base, tree)
                proof.append(time.perf_counter() - t)
                t = time.perf_counter()
                subprocess.run(
                    ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=all"],
                    capture_output=True,
                    check=True,
                )
                status.append(time.perf_counter() - t)
        finally:
            daemon.close()
        p, s = statistics.median(proof), statistics.median(status)
        print(
            f"files {args.files}: proof {p * 1000:.0f} ms (walked {acc.walked}, "
            f"raw {len(acc.raw)}), git status {s * 1000:.0f} ms, ratio {p / s:.2f}x"
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
