"""The first and the second `workspace.create` of a newly added project on a big synthetic
repository, against the first and the second plain `git worktree add -b` on an identical copy,
with and without a tree of the same size deleted just before (what setting up a repository
often does: a copy or a checkout thrown away).

On an ext4 without a journal (this machine's root filesystem) an inode deleted less than 60 s
ago is not reused, and every inode allocation steps past each such inode of its group
(`recently_deleted()` in fs/ext4/ialloc.c): whatever writes 100,000 files first after 100,000
deletions pays seconds of system time per file written, xum's create and bare git alike.

    .venv/bin/python -m bench.firstcreate --files 100000 --runs 2 [--template DIR]

Nothing is deleted until every figure is taken (a deletion would be the next subject's cost);
each subject runs on its own copy of the template, after `sync`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

from bench import procs, synth
from bench.lifecycle import _Xum


def _junk(template: Path, work: Path) -> None:
    """A tree the size of the repository, written back to disk, then deleted."""
    junk = work / "junk"
    shutil.copytree(template, junk, symlinks=True)
    os.sync()
    shutil.rmtree(junk)


def _xum(template: Path, work: Path, delete: bool) -> tuple[float, float]:
    repo = synth.copy(template, work / "repo")
    daemon = procs.xumd(work / "root")
    if delete:
        _junk(template, work)
    os.sync()
    daemon.start()
    xum = _Xum(daemon.socket_path)
    try:
        project = xum.call("project.add", {"path": str(repo)})["project"]["id"]
        first, _ = xum.timed("workspace.create", {"project_id": project, "name": "first"})
        second, _ = xum.timed("workspace.create", {"project_id": project, "name": "second"})
    finally:
        xum.close()
        daemon.stop(timeout=300)
    return first, second


def _git(template: Path, work: Path, delete: bool) -> tuple[float, float]:
    repo = synth.copy(template, work / "repo")
    if delete:
        _junk(template, work)
    os.sync()
    times = []
    for name in ("first", "second"):
        started = time.perf_counter()
        synth.git(repo, "worktree", "add", "-q", "-b", name, str(work / name), "HEAD")
        times.append(time.perf_counter() - started)
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--template", type=Path, help="a synth.make_template repository to reuse")
    parser.add_argument("--quiet-only", action="store_true", help="no subject after a deletion")
    args = parser.parse_args()
    work = procs.short_dir("xfc-")
    try:
        template = args.template or synth.make_template(work / "template", args.files)
        print(f"load average before: {os.getloadavg()}", flush=True)
        print("subject | tree deleted just before | first create s | second create s", flush=True)
        # Every subject without a deletion first: a deletion's window would reach the next ones.
        for delete in (False,) if args.quiet_only else (False, True):
            for run in range(args.runs):
                for label, subject in (("xum", _xum), ("git worktree add", _git)):
                    first, second = subject(template, work / f"{label[:3]}-{run}-{delete}", delete)
                    print(f"{label} | {delete} | {first:.2f} | {second:.2f}", flush=True)
        print(f"load average after: {os.getloadavg()}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
