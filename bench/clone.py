"""Copy-on-write checkouts: `python -m bench.clone [--files N] [--repeats R] [--dir D]`.

On a filesystem with reflinks (an XFS image, `mkfs.xfs -m reflink=1`, made and loop-mounted
here: needs root and xfsprogs; or an existing directory on XFS/Btrfs given with `--dir`), the
synthetic monorepo (`bench/monorepo.py`), a template checkout of its HEAD, then per repetition,
paired and alternated: a worktree filled from the template (`git worktree add --no-checkout`
and `lifecycle/clonecheckout.fill`: one FICLONE per file and the template's index with the
clone's stat data) against `git worktree add -b` of the same commit. Prints which one the fill
used (`reflink`, or `git` where the filesystem cannot clone) and the factor.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import anyio
from xumd.lifecycle import clonecheckout
from xumd.system.git import Git

from bench import monorepo, report, synth
from bench.lifecycle import paired
from bench.stats import Figure

MIN_IMAGE = 320 << 20
PER_FILE = 48 << 10
"""Image bytes per tracked file: the repository's objects, the template and the checkouts."""


@contextmanager
def _xfs(files: int, repeats: int) -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="xbc-", dir="/var/tmp"))
    image, mount = base / "xfs.img", base / "mnt"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(max(MIN_IMAGE, files * PER_FILE * (repeats + 3)))
    try:
        subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], check=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
        try:
            yield mount
        finally:
            subprocess.run(["umount", str(mount)], check=False)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _fill(repo: Path, path: Path, branch: str, template: Path) -> str:
    synth.git(repo, "worktree", "add", "-q", "--no-checkout", "-b", branch, str(path), "HEAD")
    return anyio.run(clonecheckout.fill, Git(), path, template)


def measure(top: Path, files: int, repeats: int) -> tuple[Figure, set[str]]:
    fig = Figure(
        "clone", f"worktree from a template ({files:,} files)", "ms", "git worktree add -b"
    )
    repo = monorepo.make(top / "repo", files)
    template = top / "template"
    synth.git(repo, "worktree", "add", "-q", "--detach", str(template), "HEAD")
    used: set[str] = set()
    for rep in range(repeats + 1):  # rep 0 warms the page cache, not recorded
        floor = ["worktree", "add", "-q", "-b", f"g{rep}", str(top / f"g{rep}"), "HEAD"]
        mine, how, base = paired(
            rep,
            partial(_fill, repo, top / f"c{rep}", f"c{rep}", template),
            partial(synth.git, repo, *floor),
        )
        used.add(how)
        if rep:
            fig.add(mine * 1000, base * 1000)
    return fig, used


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.clone", description=__doc__)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="an existing XFS/Btrfs directory")
    args = parser.parse_args(argv)
    if args.dir is not None:
        top = Path(tempfile.mkdtemp(prefix="xbc-", dir=args.dir))
        try:
            fig, used = measure(top, args.files, args.repeats)
        finally:
            shutil.rmtree(top, ignore_errors=True)
    elif os.geteuid() != 0 or shutil.which("mkfs.xfs") is None:
        sys.stderr.write("an XFS image needs root and mkfs.xfs; or give --dir on XFS/Btrfs\n")
        return 2
    else:
        with _xfs(args.files, args.repeats) as top:
            fig, used = measure(top, args.files, args.repeats)
    sys.stdout.write(f"materialised: {', '.join(sorted(used))}\n\n")
    report.table([fig], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
