"""File attributes for tests: a directory the kernel itself refuses to change."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def immutable(directory: Path) -> Iterator[None]:
    """`chattr +i` on `directory`: nothing can be created, renamed or removed in it, not even by
    root (a real EPERM from the kernel). Skips where the filesystem or privileges do not allow
    it; always undone, also when the test fails."""
    done = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot make {directory} immutable here (needs root, ext4): {done.stderr}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)
