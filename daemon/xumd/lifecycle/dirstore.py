"""The directory runtime's archive store: a plain directory has no git to snapshot into, so its
content is copied to ROOT/archive/<ws-id>/content (atomically replaced) and copied back on
unarchive."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
from pathlib import Path

import anyio
from xum_protocol.models.workspace import RestoredInfo

from xumd.lifecycle import marker, preserved
from xumd.lifecycle.rows import WorkspaceRow
from xumd.lifecycle.snapshot import Dropped


def files_under(top: Path) -> list[str]:
    return sorted(str(Path(d, f).relative_to(top)) for d, _, fs in os.walk(top) for f in fs)


def content_files(row: WorkspaceRow) -> list[str]:
    """The checkout's files, the marker excepted."""
    return [f for f in files_under(row.path) if f != marker.DIRECTORY_MARKER]


def _copy_in(archive_store: Path, row: WorkspaceRow) -> Dropped:
    store = archive_store / row.id
    tmp = archive_store / f".{row.id}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(
        row.path,
        tmp / "content",
        symlinks=True,
        ignore=shutil.ignore_patterns(marker.DIRECTORY_MARKER),
    )
    files = files_under(tmp / "content")
    manifest = {"directory": True, "files": files, "incarnation": row.incarnation}
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    # A copy of another incarnation is the user's until an unarchive settled it: kept.
    preserved.set_aside_other(store, row.incarnation)
    shutil.rmtree(store, ignore_errors=True)
    os.replace(tmp, store)
    return Dropped(preserved=files)


async def save(archive_store: Path, row: WorkspaceRow) -> Dropped:
    archive_store.mkdir(parents=True, exist_ok=True)
    return await anyio.to_thread.run_sync(_copy_in, archive_store, row)


def _copy_out(archive_store: Path, row: WorkspaceRow) -> RestoredInfo:
    content = archive_store / row.id / "content"
    if not content.is_dir():
        return RestoredInfo()
    shutil.copytree(content, row.path, symlinks=True, dirs_exist_ok=True)
    return RestoredInfo(preserved=files_under(content))


async def restore(archive_store: Path, row: WorkspaceRow) -> RestoredInfo:
    return await anyio.to_thread.run_sync(_copy_out, archive_store, row)


def _same(a: Path, b: Path) -> bool:
    """Same link target, or same regular-file content (byte for byte)."""
    try:
        if a.is_symlink() or b.is_symlink():
            return a.is_symlink() and b.is_symlink() and os.readlink(a) == os.readlink(b)
        return b.is_file() and filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


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
