"""A cgroup of its own for a test, under a hierarchy the test names (v1 freezer, v2 root), and a
writable cgroup v2 directory standing in for a delegated one."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.wait import until


def new_cgroup(parent: Path) -> Path:
    """A new, uniquely named cgroup directory under `parent`; skips the test where none can
    be made here (not root, a read-only or foreign hierarchy). The caller removes it."""
    group = parent / f"xum-test-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup under {parent}: {exc}")
    return group


def cgroup2_mount() -> Path | None:
    """Where the host's cgroup v2 hierarchy is mounted, or None."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def cgroup_members(path: Path) -> str:
    try:
        return (path / "cgroup.procs").read_text().strip()
    except OSError:
        return ""


def remove_cgroup_tree(path: Path) -> None:
    """Kill what is in it (deepest first), then remove every directory, bounded."""
    dirs = [*sorted((p for p in path.rglob("*") if p.is_dir()), reverse=True), path]
    for sub in dirs:
        with contextlib.suppress(OSError):
            (sub / "cgroup.kill").write_text("1")
    for sub in dirs:
        until(lambda sub=sub: not cgroup_members(sub), timeout=5, message=f"{sub} empty")
        with contextlib.suppress(OSError):
            sub.rmdir()


@contextlib.contextmanager
def delegated_cgroup() -> Iterator[Path]:
    """A writable cgroup v2 directory standing in for a delegated one (systemd Delegate=yes);
    removed with everything in it, whatever the test did. Skips where none can be made."""
    mount = cgroup2_mount()
    if mount is None or os.geteuid() != 0:
        pytest.skip("needs a cgroup v2 mount and root to create a cgroup in it")
    base = new_cgroup(mount)
    try:
        yield base
    finally:
        remove_cgroup_tree(base)
