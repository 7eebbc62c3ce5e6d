"""Stale git lock files (`index.lock`, `config.lock`, `packed-refs.lock`, ref locks).

A SIGKILLed git leaves its lock file behind and every later git command in that repository then
fails. A lock is cleared only when it is provably stale: no live process has it open (git holds a
lock file's descriptor open until it commits or rolls back) *and* it is older than a threshold
(covering the instant between git creating the file and our scan). Every clear is reported with
its path; a live lock is reported with its holder and left alone.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from xumd import logs

log = logs.get("xumd.lifecycle.gitlocks")

STALE_AFTER_S = 60.0
_TOP_LOCKS = ("index.lock", "config.lock", "packed-refs.lock", "HEAD.lock", "shallow.lock")
_MAX_SCAN = 10_000


@dataclass(frozen=True, slots=True)
class LockReport:
    cleared: list[str]
    live: list[dict[str, object]]


def candidate_locks(common_dir: Path) -> list[Path]:
    found = [common_dir / name for name in _TOP_LOCKS]
    worktrees = common_dir / "worktrees"
    if worktrees.is_dir():
        for admin in worktrees.iterdir():
            found.extend(admin / name for name in ("index.lock", "HEAD.lock"))
    refs = common_dir / "refs"
    scanned = 0
    for dirpath, _dirs, files in os.walk(refs):
        for name in files:
            if name.endswith(".lock"):
                found.append(Path(dirpath) / name)
        scanned += len(files)
        if scanned > _MAX_SCAN:
            break
    return [p for p in found if p.exists()]


def open_holders(paths: list[Path]) -> dict[str, int]:
    """Which of `paths` some process has open (by /proc/<pid>/fd), path -> pid."""
    wanted = {str(p) for p in paths} | {os.path.realpath(p) for p in paths}
    held: dict[str, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fd_dir = f"/proc/{entry.name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target in wanted:
                held[target] = int(entry.name)
    return held


def clear_stale(common_dir: Path, *, stale_after_s: float = STALE_AFTER_S) -> LockReport:
    locks = candidate_locks(common_dir)
    if not locks:
        return LockReport([], [])
    holders = open_holders(locks)
    now = time.time()
    cleared: list[str] = []
    live: list[dict[str, object]] = []
    for lock in locks:
        real = os.path.realpath(lock)
        pid = holders.get(str(lock)) or holders.get(real)
        try:
            age = now - lock.stat().st_mtime
        except FileNotFoundError:
            continue
        if pid is not None or age < stale_after_s:
            live.append({"path": str(lock), "pid": pid, "age_s": round(age, 1)})
            continue
        try:
            lock.unlink()
        except FileNotFoundError:
            continue
        log.warning("gitlock.cleared_stale", path=str(lock), age_s=round(age, 1))
        cleared.append(str(lock))
    return LockReport(cleared, live)
