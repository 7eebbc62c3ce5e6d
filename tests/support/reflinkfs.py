"""A real filesystem with reflinks for clone tests: an XFS image (mkfs.xfs -m reflink=1) on a
loop device, always unmounted at the end; skipped with the reason where it cannot be made."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.tmpfs import mounted

XFS_MIN_BYTES = 320 << 20
"""mkfs.xfs refuses a filesystem under 300 MB; the image file is sparse (costs little)."""


@contextmanager
def xfs_reflink(base: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting an XFS image on a loop device needs root")
    mkfs = shutil.which("mkfs.xfs")
    if mkfs is None:
        pytest.skip("mkfs.xfs is not installed (apt-get install xfsprogs)")
    image = base / "xfs.img"
    mount = base / "xfs"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(XFS_MIN_BYTES)
    made = subprocess.run(
        [mkfs, "-q", "-m", "reflink=1", str(image)], capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        pytest.skip(f"mkfs.xfs failed: {made.stderr.strip()}")
    try:
        with mounted(
            ["mount", "-o", "loop", str(image), str(mount)], mount, "an XFS image on a loop device"
        ):
            yield mount
    finally:
        image.unlink(missing_ok=True)
