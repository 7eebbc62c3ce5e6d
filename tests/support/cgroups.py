"""A cgroup of its own for a test, under a hierarchy the test names (v1 freezer, v2 root)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest


def new_cgroup(parent: Path) -> Path:
    """A new, uniquely named cgroup directory under `parent`; skips the test where none can
    be made here (not root, a read-only or foreign hierarchy). The caller removes it."""
    group = parent / f"xum-test-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup under {parent}: {exc}")
    return group
