"""Files the user asked to keep (docs/RELIABILITY.md): the saved copy under ROOT/archive/.

A saved copy is a directory `ROOT/archive/<ws-id>/` with a `manifest.json` naming its files and
the incarnation they were saved from: for the worktree runtime the ignored files matching
`preserve` (under `files/`, lifecycle/snapshot.py), for the directory runtime the whole
directory (under `content/`, lifecycle/dirstore.py). Its life:

- archive (and remove with `force`) writes it; a copy of *another* incarnation already there is
  never replaced: it is set aside as a kept copy first (`set_aside`).
- unarchive places it before setup (setup sees the user's files), then, after setup, puts back
  every file setup changed or removed (`settle`: the user's copy wins, and the result says which),
  commits `active`, verifies every file in place byte for byte, and only then deletes the copy
  (`verify`, `discard`). A copy that does not verify is set aside and reported.
- a crash anywhere in between leaves the copy where it is: the startup pass settles it for an
  active workspace whose copy is from an earlier incarnation (recovery/reconcile.py).
- remove keeps it. A copy no workspace row claims (its workspace was removed, or it was set aside)
  is a *kept copy*: listed by `workspace.strays` (kind `kept`), deleted only by
  `workspace.discard_kept`.
"""

from __future__ import annotations

import filecmp
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from xumd.base import logs
from xumd.system import fscopy, fsdelete, rawcopy

log = logs.get("xumd.lifecycle.preserved")

MANIFEST = "manifest.json"
RAW_DIR = "raw"


@dataclass(frozen=True, slots=True)
class SavedCopy:
    dir: Path
    files_root: Path
    files: list[str]
    incarnation: str | None
    directory: bool
    """The directory runtime's whole-directory copy (else a worktree's preserved files)."""
    raw: tuple[str, ...] = ()
    flags: dict[str, str] = field(default_factory=dict)
    """Index flags of the checkout's files (path -> assume_unchanged | skip_worktree), set
    again by unarchive."""
    """Entries the snapshot cannot give back byte for byte, saved as they were under `raw/`
    (lifecycle/onbytes.py, system/rawcopy.py): files, links, whole directories."""

    @property
    def raw_root(self) -> Path:
        return self.dir / RAW_DIR


@dataclass(slots=True)
class Settled:
    replaced: list[str] = field(default_factory=list)
    """Paths where the checkout held something else (setup wrote or removed it, or the branch
    has it); the user's copy was put back."""
    problems: list[str] = field(default_factory=list)
    """Paths the copy could not be put back at (a directory there, or outside the checkout)."""


def load(store_dir: Path) -> SavedCopy | None:
    """The saved copy in `store_dir` (ROOT/archive/<name>), or None without a readable one."""
    try:
        manifest = json.loads((store_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    files = [f for f in manifest.get("files", []) if isinstance(f, str)]
    directory = bool(manifest.get("directory"))
    incarnation = manifest.get("incarnation")
    raw = tuple(
        e["path"]
        for e in manifest.get("raw", [])
        if isinstance(e, dict) and isinstance(e.get("path"), str)
    )
    flags = manifest.get("flags")
    return SavedCopy(
        dir=store_dir,
        files_root=store_dir / ("content" if directory else "files"),
        files=files,
        incarnation=incarnation if isinstance(incarnation, str) else None,
        directory=directory,
        raw=raw,
        flags={str(k): str(v) for k, v in (flags.items() if isinstance(flags, dict) else [])},
    )


def same_file(a: Path, b: Path) -> bool:
    """Same link target, or same regular-file content (byte for byte)."""
    try:
        if a.is_symlink() or b.is_symlink():
            return a.is_symlink() and b.is_symlink() and os.readlink(a) == os.readlink(b)
        return b.is_file() and filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def target_in(checkout: Path, rel: str) -> Path | None:
    """Where `rel` goes in the checkout; None when its directory resolves outside it (a
    symlinked parent is never followed out)."""
    root = os.path.realpath(checkout)
    parent = os.path.realpath(os.path.join(root, os.path.dirname(rel)))
    if parent != root and not parent.startswith(root + os.sep):
        return None
    return Path(parent, os.path.basename(rel))


def settle(copy: SavedCopy, checkout: Path) -> Settled:
    """Put back every file of the copy that is not in place byte for byte (the user's copy
    wins over what setup wrote); idempotent."""
    settled = Settled()
    for rel in copy.files:
        src = copy.files_root / rel
        if not os.path.lexists(src):
            continue
        dest = target_in(checkout, rel)
        if dest is None:
            settled.problems.append(rel)
            continue
        if same_file(src, dest):
            continue
        if dest.is_dir() and not dest.is_symlink():
            settled.problems.append(rel)  # a directory there now: never deleted to make room
            continue
        existed = os.path.lexists(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if existed:
            dest.unlink()
        fscopy.copy_file(src, dest)  # holes kept, space checked, a partial copy removed
        settled.replaced.append(rel)  # setup wrote or removed it (the copy was placed first)
    stale = [rel for rel in copy.raw if not rawcopy.same(copy.raw_root, checkout, rel)]
    if stale:
        placed = rawcopy.place(copy.raw_root, checkout, stale)
        settled.replaced += placed.placed
        settled.problems += placed.problems
    return settled


def verify(copy: SavedCopy, checkout: Path) -> list[str]:
    """Files of the copy that are not in the checkout byte for byte."""
    bad: list[str] = []
    for rel in copy.files:
        src = copy.files_root / rel
        if not os.path.lexists(src):
            continue
        dest = target_in(checkout, rel)
        if dest is None or not same_file(src, dest):
            bad.append(rel)
    bad += [rel for rel in copy.raw if not rawcopy.same(copy.raw_root, checkout, rel)]
    return bad


def set_aside(copy: SavedCopy) -> Path:
    """Move the copy out of its workspace's place, to `<ws-id>.<incarnation>` next to it: a kept
    copy (listed as a stray), never deleted here."""
    suffix = copy.incarnation or "unknown"
    dest = copy.dir.with_name(f"{copy.dir.name}.{suffix}")
    n = 1
    while os.path.lexists(dest):
        n += 1
        dest = copy.dir.with_name(f"{copy.dir.name}.{suffix}.{n}")
    os.replace(copy.dir, dest)
    log.warning("preserved.set_aside", source=str(copy.dir), kept=str(dest))
    return dest


def set_aside_other(store_dir: Path, incarnation: str) -> Path | None:
    """Before a new copy of `incarnation` replaces `store_dir`: a copy of another incarnation
    there (an unarchive that never settled it) is set aside, not deleted. Returns where."""
    if not os.path.lexists(store_dir):
        return None
    old = load(store_dir)
    if old is not None and old.incarnation == incarnation:
        return None  # a replay of this same save: replacing it loses nothing
    if old is None:
        old = SavedCopy(store_dir, store_dir, [], None, False)
    return set_aside(old)


def discard(copy: SavedCopy) -> None:
    fsdelete.remove_tree(copy.dir, ignore_errors=True)


@dataclass(slots=True)
class Finished:
    kept_at: str | None = None
    unverified: list[str] = field(default_factory=list)


def settle_and_verify(copy: SavedCopy, checkout: Path) -> Settled:
    """`settle`, then a check that every file is in place (problems otherwise)."""
    settled = settle(copy, checkout)
    for rel in verify(copy, checkout):
        if rel not in settled.problems:
            settled.problems.append(rel)
    return settled


def finish(copy: SavedCopy, checkout: Path) -> Finished:
    """Once the workspace is active: verify every file in place, then delete the copy; a copy
    that does not verify is set aside (kept) and its place reported."""
    bad = verify(copy, checkout)
    if bad:
        kept = set_aside(copy)
        log.warning("preserved.unverified", checkout=str(checkout), files=len(bad), kept=str(kept))
        return Finished(kept_at=str(kept), unverified=bad)
    discard(copy)
    return Finished()
