"""A real filesystem with reflinks for clone tests: an XFS image (mkfs.xfs -m reflink=1) on a
loop device, always unmounted at the end; skipped with the reason where it cannot be made."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.tmpfs import loop_filesystem

XFS_MIN_BYTES = 320 << 20
"""mkfs.xfs refuses a filesystem under 300 MB; the image file is sparse (costs little)."""


@contextmanager
def xfs_reflink(base: Path) -> Iterator[Path]:
    with loop_filesystem(base, "xfs", XFS_MIN_BYTES, ["-q", "-m", "reflink=1"]) as mount:
        yield mount
