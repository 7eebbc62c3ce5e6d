"""The root lock in-process (issue 17, survivors of `make mutate`): a real flock on a real file.
The one-daemon rule itself is tested with real daemons in tests/test_daemon_basics.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from xumd import rootlock


def test_release_gives_the_root_back_and_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "xumd.lock"
    lock = rootlock.acquire(path)
    with pytest.raises(rootlock.RootLockedError):
        rootlock.acquire(path)  # a second open file description cannot take it meanwhile
    lock.release()
    lock.release()  # a second release closes nothing (no EBADF, no other fd closed)
    again = rootlock.acquire(path)
    try:
        assert rootlock.read_holder(path) is not None
    finally:
        again.release()
    assert rootlock.read_holder(path) is None


def test_the_lock_file_is_private(tmp_path: Path) -> None:
    """Born 0600 (it names the daemon's pid and start time; nobody else needs to open it)."""
    old = os.umask(0)
    try:
        lock = rootlock.acquire(tmp_path / "xumd.lock")
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.stat(tmp_path / "xumd.lock").st_mode) == 0o600
    finally:
        lock.release()
