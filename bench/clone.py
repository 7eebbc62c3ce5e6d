"""Copy-on-write: `python -m bench.clone [--files N] [--copy-files M] [--repeats R] [--dir D]`.

On a filesystem with reflinks (an XFS image, `mkfs.xfs -m reflink=1`, made and loop-mounted
here: needs root and xfsprogs; or an existing directory on XFS/Btrfs given with `--dir`), the
synthetic monorepo (`bench/monorepo.py`), a template checkout of its HEAD, then per repetition,
paired and alternated: a worktree filled from the template (`git worktree add --no-checkout`
and `lifecycle/clonecheckout.fill`: one FICLONE per file and the template's index with the
clone's stat data) against `git worktree add -b` of the same commit. Prints which one the fill
used (`reflink`, or `git` where the filesystem cannot clone) and the factor.

On the same filesystem, `[create] copy` of an ignored `node_modules/` (M files, log-normal
sizes around 3 KiB with a tail to 2 MiB: what `npm ci` leaves) from the main checkout into a
new directory (`lifecycle/seed.py`, as a create runs it: FICLONE per file where the filesystem
can) against `cp -a --reflink=never` of the same directory (its data written), each followed by
`sync` (the copy's writeback is most of its cost), paired and alternated; the note gives how
many files were cloned and the data each side wrote (the filesystem's used bytes before and
after, median).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import anyio
from xumd.lifecycle import clonecheckout, seed
from xumd.system.git import Git

from bench import monorepo, report, synth
from bench.lifecycle import paired, settle_disk
from bench.stats import Figure

MIN_IMAGE = 320 << 20
PER_FILE = 48 << 10
"""Image bytes per tracked file: the repository's objects, the template and the checkouts."""
COPY_MEAN = 8 << 10
"""The ignored outputs' mean file size (log-normal, median ~3 KiB), for the image's size."""
COPY_PATTERN = "node_modules/"


@contextmanager
def _xfs(files: int, copy_files: int, repeats: int) -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="xbc-", dir="/var/tmp"))
    image, mount = base / "xfs.img", base / "mnt"
    mount.mkdir()
    with open(image, "wb") as f:
        need = (files * PER_FILE + copy_files * COPY_MEAN * 2) * (repeats + 3)
        f.truncate(max(MIN_IMAGE, need))
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


def _outputs(repo: Path, files: int) -> int:
    """An ignored `node_modules/` of `files` files in the main checkout (25 to a package);
    returns its bytes."""
    rng = random.Random(28)
    total = 0
    for index in range(files):
        size = min(int(rng.lognormvariate(8.0, 1.4)), 2 << 20)
        path = repo / "node_modules" / f"pkg{index // 25}" / "lib" / f"m{index}.js"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(size))
        total += size
    return total


def _used(top: Path) -> int:
    vfs = os.statvfs(top)
    return (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize


def _writes(top: Path, fn: Callable[[], object], into: list[int]) -> Callable[[], object]:
    """`fn` then `sync` (its data on the disk: a copy's cost is mostly its writeback),
    recording in `into` the bytes the filesystem of `top` used more after it."""

    def run() -> object:
        before = _used(top)
        out = fn()
        os.sync()
        into.append(_used(top) - before)
        return out

    return run


def _seed(repo: Path, dest: Path) -> tuple[int, int]:
    """`[create] copy` of the outputs into the new directory `dest`: (files cloned, copied)."""
    dest.mkdir()
    copied = anyio.run(
        partial(
            seed.seed,
            Git(),
            repo,
            dest,
            [COPY_PATTERN],
            cap=1 << 40,
            timeout_s=3600.0,
            stopping=lambda: False,
        )
    )
    return copied.cloned, copied.copied


def _cp(repo: Path, dest: Path) -> None:
    dest.mkdir()
    argv = ["cp", "-a", "--reflink=never", str(repo / "node_modules"), str(dest)]
    subprocess.run(argv, check=True)


def measure_copy(top: Path, repo: Path, files: int, repeats: int) -> Figure:
    mib = _outputs(repo, files) >> 20
    fig = Figure(
        "clone",
        f"[create] copy of node_modules, then sync ({files:,} files, {mib:,} MiB)",
        "ms",
        "cp -a --reflink=never of the same directory, then sync",
    )
    settle_disk()
    counts: set[tuple[int, int]] = set()
    mine_bytes: list[int] = []
    floor_bytes: list[int] = []
    for rep in range(repeats + 1):  # rep 0 warms the page cache, not recorded
        mine, made, base = paired(
            rep,
            _writes(top, partial(_seed, repo, top / f"s{rep}"), mine_bytes),
            _writes(top, partial(_cp, repo, top / f"f{rep}"), floor_bytes),
        )
        assert isinstance(made, tuple)
        counts.add(made)
        if rep:
            fig.add(mine * 1000, base * 1000)
    (cloned, copied), *_ = sorted(counts)
    fig.note = (
        f"{cloned:,} cloned, {copied:,} copied; data written: "
        f"{statistics.median(mine_bytes[1:]) / (1 << 20):,.1f} MiB against "
        f"{statistics.median(floor_bytes[1:]) / (1 << 20):,.1f} MiB"
    )
    return fig


def _both(top: Path, files: int, copy_files: int, repeats: int) -> tuple[list[Figure], set[str]]:
    fig, used = measure(top, files, repeats)
    return [fig, measure_copy(top, top / "repo", copy_files, repeats)], used


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.clone", description=__doc__)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--copy-files", type=int, default=20_000, help="ignored outputs' files")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="an existing XFS/Btrfs directory")
    args = parser.parse_args(argv)
    if args.dir is not None:
        top = Path(tempfile.mkdtemp(prefix="xbc-", dir=args.dir))
        try:
            figures, used = _both(top, args.files, args.copy_files, args.repeats)
        finally:
            shutil.rmtree(top, ignore_errors=True)
    elif os.geteuid() != 0 or shutil.which("mkfs.xfs") is None:
        sys.stderr.write("an XFS image needs root and mkfs.xfs; or give --dir on XFS/Btrfs\n")
        return 2
    else:
        with _xfs(args.files, args.copy_files, args.repeats) as top:
            figures, used = _both(top, args.files, args.copy_files, args.repeats)
    sys.stdout.write(f"checkout from a template: {', '.join(sorted(used))}\n\n")
    report.table(figures, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
