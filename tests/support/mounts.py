"""Real mounts for tests: bind mounts and tmpfs, always unmounted at the end (even when the test
fails), and a skip with the reason where this process may not mount."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


class Mounts:
    """Mounts made under `base` (the test's temporary directory). At the end every mount point
    under `base` is unmounted, wherever the daemon moved it (a checkout moved into the trash
    carries its mounts along), before anything deletes `base`."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.points: list[Path] = []

    def _mount(self, argv: list[str], target: Path) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting needs root (this test mounts real bind mounts and tmpfs)")
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"mounting is not permitted here: {done.stderr.strip()}")
        self.points.append(target)
        return target

    def require(self) -> None:
        """Skip (with the reason) unless this process may mount: for a test whose mounts are
        made by something else (a script the daemon runs)."""
        probe = self.base / ".mount-probe"
        probe.mkdir(exist_ok=True)
        self.unmount(self.tmpfs(probe, size="1m"))

    def bind(self, source: Path, target: Path) -> Path:
        return self._mount(["mount", "--bind", str(source), str(target)], target)

    def tmpfs(self, target: Path, size: str = "4m", options: str = "") -> Path:
        opts = f"size={size}" + (f",{options}" if options else "")
        return self._mount(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(target)], target)

    def overlay(self, lower: Path, scratch: Path, target: Path, options: str = "") -> Path:
        """An overlayfs at `target` over `lower`, its upper and work directories in `scratch`."""
        upper, work = scratch / "upper", scratch / "work"
        upper.mkdir(parents=True)
        work.mkdir()
        opts = f"lowerdir={lower},upperdir={upper},workdir={work}" + (
            f",{options}" if options else ""
        )
        return self._mount(["mount", "-t", "overlay", "-o", opts, "overlay", str(target)], target)

    def unmount(self, target: Path) -> None:
        subprocess.run(["umount", str(target)], check=True, capture_output=True)
        self.points.remove(target)

    def close(self) -> None:
        for _ in range(10):
            points = sorted(mounts_under(self.base), key=len, reverse=True)
            if not points:
                break
            for point in points:  # deepest first; lazy, in case a process still sits inside
                subprocess.run(["umount", "-l", point], check=False, capture_output=True)
        self.points.clear()
        left = mounts_under(self.base)
        assert not left, f"test mounts left behind: {left}"


@contextmanager
def real_mounts(base: Path) -> Iterator[Mounts]:
    mounts = Mounts(base)
    try:
        yield mounts
    finally:
        mounts.close()


def mounts_under(under: Path) -> list[str]:
    """Mount points at or below `under` (canonical), read from the mount table independently of
    the daemon's own parser (the octal escapes the kernel uses for space, tab, newline, \\)."""
    real = os.path.realpath(under)
    found = []
    for line in Path("/proc/self/mountinfo").read_bytes().splitlines():
        raw = line.split(b" ")[4]
        point = os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), raw))
        if point == real or point.startswith(real + "/"):
            found.append(point)
    return found
