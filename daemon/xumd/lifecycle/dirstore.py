"""The directory runtime's archive store: a plain directory has no git to snapshot into, so its
content is copied to ROOT/archive/<ws-id>/content (atomically replaced) and copied back on
unarchive. Copies go through `fscopy` (by fd, links not followed, special files skipped and
reported, holes kept, space checked first, partial output removed on failure)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import anyio
from xum_protocol.models.workspace import RestoredInfo

from xumd.base import logs
from xumd.checkouts import marker
from xumd.lifecycle import preserved
from xumd.lifecycle.rows import WorkspaceRow
from xumd.lifecycle.snapshot import Dropped
from xumd.system import fscopy, fsdelete

log = logs.get("xumd.lifecycle.dirstore")

TMP_SUFFIX = ".tmp"
_PARTIAL = re.compile(r"\.ws_[0-9a-f]{16}\.(tmp|[0-9a-f]{8})")
"""Partial copies: this module's `.<ws-id>.tmp` and the preserved files' `.<ws-id>.<hex>`."""


def files_under(top: Path) -> list[str]:
    return sorted(
        str(Path(d, f).relative_to(top)) for d, _, fs in fsdelete.walk_within(top) for f in fs
    )


def content_files(row: WorkspaceRow) -> list[str]:
    """The checkout's files, the marker excepted."""
    return [f for f in files_under(row.path) if f != marker.DIRECTORY_MARKER]


def _not_marker(rel: str) -> bool:
    return rel == marker.DIRECTORY_MARKER


def _copy_in(archive_store: Path, row: WorkspaceRow) -> Dropped:
    store = archive_store / row.id
    tmp = archive_store / f".{row.id}{TMP_SUFFIX}"
    fsdelete.remove_tree(tmp, ignore_errors=True)
    try:
        os.mkdir(tmp, 0o700)
        copied = fscopy.copy_tree(
            row.path, tmp / "content", skip=_not_marker, what=f"the checkout of {row.name!r}"
        )
        special = [s.as_dict() for s in copied.special]
        manifest = {
            "directory": True,
            "files": copied.files,
            "special": special,
            "incarnation": row.incarnation,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest))
        # A copy of another incarnation is the user's until an unarchive settled it: kept.
        preserved.set_aside_other(store, row.incarnation)
        fsdelete.remove_tree(store, ignore_errors=True)
        os.replace(tmp, store)
    except BaseException:
        # Never leave a partial copy behind (it would hold the space until the next archive).
        fsdelete.remove_tree(tmp, ignore_errors=True)
        raise
    if special:
        log.info("dirstore.special_skipped", workspace=row.id, count=len(special))
    return Dropped(preserved=copied.files, special=special)


def sweep_partial(archive_store: Path) -> int:
    """Remove partial copies a crash left in the archive store (startup, before anything runs:
    every such temporary directory there is a copy that never completed)."""
    swept = 0
    try:
        names = os.listdir(archive_store)
    except FileNotFoundError:
        return 0
    for name in names:
        if _PARTIAL.fullmatch(name):
            fsdelete.remove_tree(archive_store / name, ignore_errors=True)
            swept += 1
    if swept:
        log.info("dirstore.partial_swept", count=swept)
    return swept


async def save(archive_store: Path, row: WorkspaceRow) -> Dropped:
    archive_store.mkdir(parents=True, exist_ok=True)
    return await anyio.to_thread.run_sync(_copy_in, archive_store, row)


def _copy_out(archive_store: Path, row: WorkspaceRow) -> RestoredInfo:
    content = archive_store / row.id / "content"
    if not content.is_dir():
        return RestoredInfo()
    copied = fscopy.merge_tree(content, row.path, what=f"the archive of {row.name!r}")
    return RestoredInfo(preserved=copied.files)


async def restore(archive_store: Path, row: WorkspaceRow) -> RestoredInfo:
    return await anyio.to_thread.run_sync(_copy_out, archive_store, row)


def _same(a: Path, b: Path) -> bool:
    """Same link target, or same regular-file content (byte for byte). A special file is never
    opened (reading a FIFO blocks): it counts as saved, since no archive can hold one."""
    try:
        special = fscopy.special_type(a.lstat().st_mode) is not None
    except OSError:
        return False
    return special or preserved.same_file(a, b)


def _unsaved(archive_store: Path, row: WorkspaceRow) -> list[str]:
    content = archive_store / row.id / "content"
    found = []
    for rel in content_files(row):
        if not _same(row.path / rel, content / rel):
            found.append(rel)
    return found


async def unsaved_files(archive_store: Path, row: WorkspaceRow) -> list[str]:
    """Files of a lingering (archived) directory checkout that its archive copy does not hold:
    new since the archive, or changed. Files deleted since are not listed (the archive has
    them). Trashing the checkout would lose exactly these."""
    return await anyio.to_thread.run_sync(_unsaved, archive_store, row)
