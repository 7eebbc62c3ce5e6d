"""A workspace's rebuildable directories and how recently its work changed.

Which directories: the untracked, ignored directories of the checkout that match `[gc]
rebuildable` (ROOT/config.toml) or the project's `.xum/config.toml` `[gc] rebuildable`, as git
matches `[create] copy` (lifecycle/seed.py `matching`: a directory wholly ignored is one
entry). A directory with a tracked path under it is never one (git lists it only when nothing
under it is tracked; `tracked` checks again right before a move).

One walk of the checkout (system/walk.py: by descriptor, never across a mount, under a
deadline) then tells, for each directory, its allocated bytes, whether a mount sits inside it,
and whether a `preserve` glob names anything in it; and, outside them, the newest mtime: when the
workspace's own work last changed. A walk cut by its deadline says so: its directories are not
offered (what is unseen is not known to be safe), and its mtime is a lower bound."""

from __future__ import annotations

import fnmatch
import os
import stat
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from xumd.lifecycle import seed
from xumd.system import fsdelete, smallfile
from xumd.system import walk as treewalk
from xumd.system.git import Git

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
PROJECT_CONFIG = Path(".xum") / "config.toml"
MAX_CONFIG_BYTES = 1 << 20


@dataclass(slots=True)
class Found:
    rel: str
    bytes: int = 0
    mount: str | None = None
    preserved: str | None = None


@dataclass(slots=True)
class Scan:
    dirs: dict[str, Found] = field(default_factory=dict)
    newest: float = 0.0
    """The newest mtime (wall clock) outside the rebuildable directories; 0: none seen."""
    complete: bool = True
    error: str | None = None


def project_patterns(project_path: Path) -> list[str]:
    """The project's own `[gc] rebuildable` (its main checkout's `.xum/config.toml`); a file
    that cannot be read or holds something else adds nothing."""
    try:
        raw = smallfile.read_regular(project_path / PROJECT_CONFIG, MAX_CONFIG_BYTES)
        data = tomllib.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError):
        return []
    table = data.get("gc", {})
    found = table.get("rebuildable", []) if isinstance(table, dict) else []
    if not isinstance(found, list):
        return []
    return [
        p for p in found if isinstance(p, str) and p.strip() and "\0" not in p and "\n" not in p
    ]


async def directories(git: Git, checkout: Path, patterns: list[str]) -> list[str]:
    """The checkout's untracked ignored directories matching `patterns` (relative, no slash)."""
    if not patterns:
        return []
    return [e.rstrip("/") for e in await seed.matching(git, checkout, patterns) if e.endswith("/")]


async def tracked(git: Git, checkout: Path, rel: str) -> bool:
    """Whether git tracks anything at or under `rel` (also: it cannot tell)."""
    result = await git.run(checkout, "ls-files", "-z", "--", rel, check=False)
    return not result.ok or bool(result.output.text().strip("\0"))


async def ignored(git: Git, checkout: Path, rel: str) -> bool:
    """Whether git ignores `rel` (a directory) now."""
    result = await git.run(checkout, "check-ignore", "-q", "--", rel + "/", check=False)
    return result.ok


def preserved(rel: str, globs: list[str]) -> bool:
    """Whether a `preserve` glob could name `rel` or something under it. A glob without a
    slash matches a name at any depth: checked against the walk's names (`scan`)."""
    for glob in globs:
        if "/" in glob:
            if fnmatch.fnmatchcase(rel, glob) or glob.startswith(rel + "/"):
                return True
            if fnmatch.fnmatchcase(rel + "/x", glob.rstrip("/") + "/*"):
                return True
        elif fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], glob):
            return True
    return False


def scan(checkout: Path, rels: list[str], globs: list[str], deadline: float) -> Scan:
    """Walk `checkout` once (in a worker thread): each directory of `rels`' bytes, mounts and
    preserved names; the newest mtime outside them."""
    out = Scan(dirs={rel: Found(rel) for rel in rels})
    names = [g for g in globs if "/" not in g]
    try:
        mounts = [
            p for p in fsdelete.mounts_at_or_under(checkout) if p != os.path.realpath(checkout)
        ]
    except OSError:
        mounts = []
    real = os.path.realpath(checkout).rstrip("/") + "/"
    for point in mounts:
        inside = point[len(real) :] if point.startswith(real) else ""
        for found in out.dirs.values():
            if inside == found.rel or inside.startswith(found.rel + "/"):
                found.mount = point
    try:
        top = os.open(checkout, _DIR_FLAGS)
    except OSError as exc:
        out.complete, out.error = False, str(exc)
        return out

    def failed(rel: str, exc: OSError) -> None:
        out.complete, out.error = False, f"{rel or '.'}: {exc.strerror or exc}"

    seen: set[tuple[int, int]] = set()
    policy = treewalk.Policy(sort=False, mount_ids=bool(mounts), errors=failed)
    try:
        for count, step in enumerate(treewalk.Walk(top, policy)):
            if count % 1024 == 0 and time.monotonic() > deadline:
                out.complete, out.error = False, "the walk hit its deadline (usage.deadline_s)"
                break
            rel = step.rel
            first = rel.split("/", 1)[0]
            owner = _owner(out.dirs, rel)
            if step.kind == treewalk.MOUNT:
                if owner is not None and owner.mount is None:
                    owner.mount = os.path.join(str(checkout), rel)
                continue
            if step.kind != treewalk.ENTRY:
                continue
            st = step.lstat()
            if owner is None:
                if first != ".git" and not stat.S_ISDIR(st.st_mode):
                    out.newest = max(out.newest, st.st_mtime)
                continue
            if names and owner.preserved is None and rel != owner.rel:
                base = rel.rsplit("/", 1)[-1]
                if any(fnmatch.fnmatchcase(base, g) for g in names):
                    owner.preserved = rel
            if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
            owner.bytes += st.st_blocks * 512
    finally:
        os.close(top)
    return out


def _owner(dirs: dict[str, Found], rel: str) -> Found | None:
    """The rebuildable directory `rel` is (or is under), if any."""
    if not dirs:
        return None
    cut = rel
    while cut:
        found = dirs.get(cut)
        if found is not None:
            return found
        cut = cut.rpartition("/")[0]
    return None
