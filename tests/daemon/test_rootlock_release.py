"""The root lock in-process (survivors of `make mutate`): a real flock on a real file.
The one-daemon rule itself is tested with real daemons in tests/daemon/test_basics.py."""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path

import pytest
from xumd.system import rootlock

from tests.support.lockholder import read_holder


def test_release_gives_the_root_back_and_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "xumd.lock"
    lock = rootlock.acquire(path)
    with pytest.raises(rootlock.RootLockedError):
        rootlock.acquire(path)  # a second open file description cannot take it meanwhile
    lock.release()
    lock.release()  # a second release closes nothing (no EBADF, no other fd closed)
    again = rootlock.acquire(path)
    try:
        assert read_holder(path) is not None
    finally:
        again.release()
    assert read_holder(path) is None


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


def test_the_refusal_names_the_holder_and_when_it_started(tmp_path: Path) -> None:
    """What a second daemon prints comes from the holder's record: its pid and its start time
    (the record's `started_at`, formatted), never `?` while a record is there."""
    path = tmp_path / "xumd.lock"
    lock = rootlock.acquire(path)
    try:
        holder = read_holder(path)
        assert holder is not None and holder["pid"] == os.getpid()
        with pytest.raises(rootlock.RootLockedError) as refused:
            rootlock.acquire(path)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started_at"]))
        assert f"(pid {os.getpid()}, started {when})" in str(refused.value)
        assert refused.value.holder == holder
    finally:
        lock.release()


def test_read_holder_of_a_root_without_a_lock_file(tmp_path: Path) -> None:
    """A root no daemon ever ran on has no lock file: nobody holds it (not an error)."""
    assert read_holder(tmp_path / "xumd.lock") is None


def test_a_lock_on_descriptor_zero_is_released(tmp_path: Path) -> None:
    """A daemon started with stdin closed (`xumd <&-`) gets descriptor 0 for its lock file:
    release must close it too (else the root stays locked until the process exits)."""
    saved = os.dup(0)
    try:
        os.close(0)
        lock = rootlock.acquire(tmp_path / "xumd.lock")
        assert lock.fd == 0
        lock.release()
        with pytest.raises(OSError) as closed:
            os.fstat(0)
        assert closed.value.errno == errno.EBADF
        assert read_holder(tmp_path / "xumd.lock") is None
    finally:
        os.dup2(saved, 0)
        os.close(saved)


def test_a_failed_lock_attempt_leaks_no_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flock failing otherwise than `already held` (ENOLCK: the kernel's lock table is full; a
    fault, since it cannot be produced on demand) propagates, and the file is closed: a daemon
    that retries does not leak a descriptor per attempt."""

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    before = set(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(rootlock.fcntl, "flock", no_locks)
    with pytest.raises(OSError) as failed:
        rootlock.acquire(tmp_path / "xumd.lock")
    monkeypatch.undo()
    assert failed.value.errno == errno.ENOLCK
    assert set(os.listdir("/proc/self/fd")) <= before
