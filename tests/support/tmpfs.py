"""Real small filesystems for resource-exhaustion tests: a tmpfs of a given size or inode
count, filled to the last byte, always unmounted (lazily) even when the test fails."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(mount: Path, options: str = "size=4m") -> Iterator[Path]:
    """Mount a tmpfs at `mount` (created); skip the test where mounting is not permitted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount.mkdir(parents=True, exist_ok=True)
    argv = ["mount", "-t", "tmpfs", "-o", f"{options},mode=0700", "tmpfs", str(mount)]
    with mounted(argv, mount, "a tmpfs"):
        yield mount


@contextmanager
def mounted(argv: list[str], mount: Path, what: str) -> Iterator[None]:
    """Run the mount command `argv` (onto `mount`); skip the test, naming `what`, where it
    fails; always unmount (lazily) at the end, even when the test fails."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount {what} here: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


@contextmanager
def loop_filesystem(base: Path, fstype: str, size: int, mkfs_args: list[str]) -> Iterator[Path]:
    """A real `fstype` filesystem of `size` bytes (a sparse image: it costs what is written) on
    a loop device under `base`, always unmounted and its image gone at the end; skipped with the
    reason where it cannot be made (not root, no mkfs, no loop device)."""
    what = f"an {fstype.upper()} image on a loop device"
    if os.geteuid() != 0:
        pytest.skip(f"mounting {what} needs root")
    mkfs = shutil.which(f"mkfs.{fstype}")
    if mkfs is None:
        pytest.skip(f"mkfs.{fstype} is not installed")
    image = base / f"{fstype}.img"
    mount = base / fstype
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(size)
    made = subprocess.run(
        [mkfs, *mkfs_args, str(image)], capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        pytest.skip(f"mkfs.{fstype} failed: {made.stderr.strip()}")
    try:
        with mounted(["mount", "-o", "loop", str(image), str(mount)], mount, what):
            yield mount
    finally:
        image.unlink(missing_ok=True)


def fill(directory: Path, name: str = "filler") -> Path:
    """Fill the filesystem of `directory` to the last byte; return the filler file."""
    filler = directory / name
    chunk = b"\0" * (1 << 16)
    for size in (len(chunk), 1):
        try:
            with filler.open("ab") as out:
                while True:
                    out.write(chunk[:size])
                    out.flush()
        except OSError:
            pass
    return filler


def use_inodes(directory: Path) -> list[Path]:
    """Create empty files in `directory` until its filesystem has no inode left."""
    made: list[Path] = []
    try:
        while True:
            path = directory / f"inode{len(made)}"
            path.touch()
            made.append(path)
    except OSError:
        pass
    return made
