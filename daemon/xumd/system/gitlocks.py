"""Stale git lock files (`index.lock`, `config.lock`, `packed-refs.lock`, ref locks).

A SIGKILLed git leaves its lock file behind and every later git command in that repository then
fails. A lock is cleared only when its owner is provably gone:

- no process has it open (git holds some lock files open until it commits or rolls back), and
- no git process of this user works in that repository: `git commit` waiting in the editor holds
  `index.lock` with no descriptor open, for as long as the user types. A git process belongs to
  the repository when its `GIT_DIR`/`GIT_COMMON_DIR`, its `--git-dir=` argument, or its working
  directory (git chdirs for `-C`) leads to the same common git directory, and
- it is older than a threshold (a tool we cannot recognise, e.g. a libgit2 editor plugin, between
  creating the file and our scan).

Every clear is reported with its path; a live lock is reported with its holder and left alone.
When one of our git commands then fails on such a lock, `lock_holder` names who holds it (the
git runner answers `busy` with that, after a bounded wait).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from xumd.base import logs
from xumd.system import smallfile
from xumd.system.fdlimits import is_exhausted
from xumd.system.platform import current

log = logs.get("xumd.system.gitlocks")

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
    """Which of `paths` some process has open (the platform's look at every process's open
    files), path -> pid."""
    return current().open_holders({str(p) for p in paths} | {os.path.realpath(p) for p in paths})


@dataclass(frozen=True, slots=True)
class GitProcess:
    pid: int
    command: str  # argv joined, truncated: for the message naming the holder


def _read(path: str) -> bytes:
    """A `.git` file's bytes (the regular file only: smallfile never blocks on a FIFO swapped
    in), empty when it cannot be read; out of descriptors raises."""
    try:
        return smallfile.read_head(path, DOTGIT_MAX)
    except OSError as exc:
        if is_exhausted(exc):
            # Out of descriptors is not "no such process": a scan that could not look must
            # not conclude that nobody holds a lock (fail closed; the caller answers).
            raise
        return b""


DOTGIT_MAX = 256 * 1024
"""A `.git` file's `gitdir:` line, read whole (far beyond a path)."""


COMMONDIR_MAX = 16384
"""More than a path (at most PATH_MAX) can hold."""


def common_dir_of(git_dir: str) -> str:
    """The common dir of a git dir (a linked worktree's admin dir names it in `commondir`)."""
    try:
        # The repository is the user's: a FIFO there must not hold the event loop's thread.
        raw = smallfile.read_regular(os.path.join(git_dir, "commondir"), COMMONDIR_MAX)
        common = raw.decode("utf-8", errors="replace").strip()
    except OSError:
        return os.path.realpath(git_dir)
    return os.path.realpath(os.path.join(git_dir, common))


def common_dir_above(path: Path) -> Path | None:
    """The repository's common git dir of a path inside a git dir (a lock file): walk up to the
    git dir (an admin dir with `commondir`, or a dir with HEAD and refs/), then its common dir."""
    here = path.parent
    for _ in range(32):
        try:
            # First: a linked worktree's admin dir may have refs/ too.
            if (here / "commondir").is_file() or (
                (here / "HEAD").exists() and (here / "refs").is_dir()
            ):
                return Path(common_dir_of(str(here)))
        except OSError:
            return None
        if here.parent == here:
            return None
        here = here.parent
    return None


def _git_dir_above(cwd: str) -> str | None:
    """The git dir a git process started in `cwd` would use (`.git` dir, or a `.git` file's
    `gitdir:`), walking up like git's discovery does."""
    here = cwd
    for _ in range(64):
        dotgit = os.path.join(here, ".git")
        if os.path.isdir(dotgit):
            return dotgit
        if os.path.isfile(dotgit):
            text = _read(dotgit).decode(errors="replace").strip()
            if text.startswith("gitdir:"):
                return os.path.join(here, text.removeprefix("gitdir:").strip())
            return None
        if os.path.isfile(os.path.join(here, "HEAD")) and os.path.isdir(os.path.join(here, "refs")):
            return here  # inside a git dir itself (a bare repository, or .git)
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent
    return None


def _process_git_dir(pid: int, cwd: str) -> str | None:
    environ = dict(
        item.split(b"=", 1) for item in (current().environ(pid) or b"").split(b"\0") if b"=" in item
    )
    for name in (b"GIT_COMMON_DIR", b"GIT_DIR"):
        value = environ.get(name)
        if value:
            return os.path.join(cwd, os.fsdecode(value))
    for arg in current().cmdline(pid).split(b"\0"):
        if arg.startswith(b"--git-dir="):
            return os.path.join(cwd, os.fsdecode(arg.removeprefix(b"--git-dir=")))
    return _git_dir_above(cwd)


def git_processes(common_dir: Path) -> list[GitProcess]:
    """This user's running git processes whose repository is `common_dir`."""
    target = os.path.realpath(common_dir)
    found: list[GitProcess] = []
    for pid, comm, cwd in current().processes_of(os.getuid(), _is_git):
        git_dir = _process_git_dir(pid, cwd)
        if git_dir is None or common_dir_of(git_dir) != target:
            continue
        argv = current().cmdline(pid).split(b"\0")
        command = " ".join(os.fsdecode(a) for a in argv if a)[:200]
        found.append(GitProcess(pid, command or comm))
    return found


def _is_git(name: str) -> bool:
    return name == "git" or name.startswith("git-")


def lock_holder(lock: Path, common_dir: Path) -> dict[str, object]:
    """Who keeps `lock`: a process with it open, else a git process of the repository, else
    unknown (with the lock's age). For a `busy` answer naming the lock and its holder."""
    info: dict[str, object] = {"kind": "git_lock", "lock": str(lock)}
    try:
        info["age_s"] = round(time.time() - lock.stat().st_mtime, 1)
    except OSError:
        info["gone"] = True
        return info
    opened = open_holders([lock])
    if opened:
        pid = next(iter(opened.values()))
        info["pid"] = pid
        info["name"] = current().name(pid)
        return info
    procs = git_processes(common_dir)
    if procs:
        info["pid"] = procs[0].pid
        info["name"] = procs[0].command
    return info


def clear_stale(common_dir: Path, *, stale_after_s: float = STALE_AFTER_S) -> LockReport:
    locks = candidate_locks(common_dir)
    if not locks:
        return LockReport([], [])
    holders = open_holders(locks)
    # The daemon's own git children count too: one running in this repository (another
    # workspace's snapshot) may own a lock, and keeping a lock one more time is the safe side.
    working = git_processes(common_dir)
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
        if pid is None and working:
            # Not provably gone: a git of this repository runs (`git commit` in the editor
            # holds index.lock without any descriptor open).
            pid = working[0].pid
        if pid is not None or age < stale_after_s:
            live.append({"path": str(lock), "pid": pid, "age_s": round(age, 1)})
            log.info("gitlock.live", path=str(lock), pid=pid, age_s=round(age, 1))
            continue
        try:
            lock.unlink()
        except FileNotFoundError:
            continue
        log.warning("gitlock.cleared_stale", path=str(lock), age_s=round(age, 1))
        cleared.append(str(lock))
    return LockReport(cleared, live)
