"""Strays: checkouts under the xum root, and git admin entries pointing into it, that no workspace
row claims (design invariant 3). Listed with what they contain; never deleted by the daemon.
Also kept copies of preserved files that no row claims (kind `kept`: a removed workspace's, or
one set aside), which the user deletes with `workspace.discard_kept` once they have what they
need.

`scan` is cheap (directory listings and one small file per admin entry, no git) and runs at
startup for the status count; `describe` adds the content (files, uncommitted changes, branch),
which needs git, only when a client asks (`workspace.strays`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
from xum_protocol.models.recovery import StrayInfo

from xumd.base import logs
from xumd.base.paths import RootPaths
from xumd.checkouts import marker
from xumd.checkouts.adminfile import read_admin_file
from xumd.cleanup.obligations import Obligations
from xumd.lifecycle import preserved, rows, views
from xumd.lifecycle.pool import records as pool
from xumd.store import Store
from xumd.system import fsdelete
from xumd.system.git import Git

log = logs.get("xumd.recovery.strays")

MAX_FILES = 100_000
MAX_UNCOMMITTED = 200


@dataclass(frozen=True, slots=True)
class Stray:
    kind: str  # checkout | admin_entry | kept
    path: str
    project_id: str | None
    admin_dir: str | None
    repo: str | None
    workspace_id: str | None = None


def _few_claimed(store: Store) -> set[str]:
    """The paths of the claims there are few of: rename journals and the warm pool's entries
    (the pool's checkouts are the daemon's)."""
    claimed = pool.entry_paths(store)
    for r in rows.rename_journals(store):
        claimed.update((r["from_path"], r["to_path"]))
    return claimed


CHUNK = 500
"""Paths checked against the claims at a time (one indexed query per table)."""


class _Claims:
    """Which of some paths nothing claims. Looked up by the paths asked about, a chunk at a
    time: a start-up's count on a root of 10,000 checkouts never holds every claimed path
    (its peak stayed in the allocator's pages: docs/PERFORMANCE.md, "Start-up with records").
    Every claimed path, resolved, only once a path is not claimed as it is spelled (a link)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._steps = Obligations(store)
        self._few = _few_claimed(store)
        self._real: set[str] | None = None

    def unclaimed(self, paths: Iterable[str]) -> list[str]:
        left: list[str] = []
        listed = iter(paths)
        while chunk := list(itertools.islice(listed, CHUNK)):
            claimed = rows.workspace_paths_among(self._store, chunk) | self._few
            rest = [path for path in chunk if path not in claimed]
            if rest:
                claimed |= self._steps.unfinished_paths_among(rest)
            for path in rest:
                if path in claimed:
                    continue
                if os.path.realpath(path) not in self._every_claimed_real():
                    left.append(path)
        return left

    def _every_claimed_real(self) -> set[str]:
        """Every path a row, a rename journal or an unfinished cleanup step claims, resolved."""
        if self._real is None:
            claimed = rows.workspace_paths(self._store) | self._few
            claimed.update(self._steps.unfinished_paths())
            self._real = {os.path.realpath(p) for p in claimed}
        return self._real


def _children(directory: Path | str) -> list[str]:
    return list(_child_paths(directory))


def _child_paths(directory: Path | str) -> Iterator[str]:
    """The directories in `directory`, as listed (nothing when it cannot be listed)."""
    try:
        with os.scandir(directory) as entries:
            for e in entries:
                # Dot entries are the daemon's own (.xum-trash of the cleanup feature).
                if not e.name.startswith(".") and e.is_dir(follow_symlinks=False):
                    yield e.path
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return


def _read(path: Path) -> str | None:
    """A git admin file's text, stripped; None when unreadable (a FIFO is never waited on:
    `xumd.checkouts.adminfile`)."""
    text = read_admin_file(path)
    return text.strip() if text is not None else None


def _inside(path: str, tops: list[str]) -> bool:
    return any(path == t or path.startswith(t.rstrip("/") + "/") for t in tops)


def scan(store: Store, paths: RootPaths, project_id: str | None = None) -> list[Stray]:
    claims = _Claims(store)
    projects = rows.list_projects(store)
    if project_id is not None:
        projects = [p for p in projects if p.id == project_id]
    by_dir: dict[str, str | None] = {}
    for project in projects:
        by_dir[str(views.workspaces_dir(paths.workspaces, project))] = project.id
    if project_id is None:
        # Directories of projects that are gone still hold checkouts nobody claims.
        for child in _children(paths.workspaces):
            by_dir.setdefault(child, None)
    tops = sorted({str(paths.root), *by_dir})

    found: dict[str, Stray] = {}
    for directory, owner in by_dir.items():
        for checkout in claims.unclaimed(_child_paths(directory)):
            found[checkout] = Stray("checkout", checkout, owner, None, None)

    for project in projects:
        if project.kind != "git":
            continue
        admin_root = project.path / ".git" / "worktrees"
        entries: list[tuple[str, str]] = []
        for admin_dir in _children(admin_root):
            gitdir = _read(Path(admin_dir) / "gitdir")
            if not gitdir:
                continue
            target = str(Path(gitdir).parent)
            if not _inside(target, tops) and not _inside(os.path.realpath(target), tops):
                continue  # the user's own worktree elsewhere: not ours to judge
            entries.append((admin_dir, target))
        unclaimed = set(claims.unclaimed([target for _, target in entries]))
        for admin_dir, target in entries:
            if target not in unclaimed:
                continue
            prior = found.get(target)
            found[target] = Stray(
                "checkout" if prior or os.path.isdir(target) else "admin_entry",
                target,
                project.id,
                admin_dir,
                str(project.path),
            )
    for kept in scan_kept(store, paths):
        if project_id is None or kept.project_id == project_id:
            found[kept.path] = kept
    return sorted(found.values(), key=lambda s: s.path)


def scan_kept(store: Store, paths: RootPaths) -> list[Stray]:
    """Kept copies of preserved files (lifecycle/preserved.py) that no workspace row claims:
    `archive/<ws-id>` of a removed workspace, and any copy set aside (`<ws-id>.<incarnation>`).
    An archive copy of a live row (`archive/<its id>`) is that row's, never a stray."""
    found: list[Stray] = []
    children = _children(paths.archive_store)
    if not children:
        return found
    # One query for the copies' rows, whether the archive holds one copy or thousands.
    live = rows.workspaces_among(store, {os.path.basename(p).split(".", 1)[0] for p in children})
    for path in children:
        name = os.path.basename(path)
        workspace_id = name.split(".", 1)[0]
        if workspace_id in live and "." not in name:
            continue
        found_row = live.get(workspace_id)
        project_id = (
            str(found_row["project_id"])
            if found_row is not None
            else _tombstone_project(store, workspace_id)
        )
        found.append(Stray("kept", path, project_id, None, None, workspace_id))
    return found


def _tombstone_project(store: Store, workspace_id: str) -> str | None:
    found = rows.tombstone(store, workspace_id)
    return str(found["project_id"]) if found else None


def kept_note(store: Store, stray: Stray) -> str:
    name = os.path.basename(stray.path)
    wid = stray.workspace_id or name
    if "." in name:
        return (
            f"saved copy of workspace {wid} (incarnation {name.split('.', 2)[1]}) set aside: an "
            "unarchive never verified it in place, and a newer copy took its place"
        )
    found = rows.tombstone(store, wid)
    label = f" ({found['name']})" if found else ""
    return f"preserved files of removed workspace {wid}{label}"


def _count_files(top: Path) -> tuple[int, bool]:
    count = 0
    for directory, dirs, files in fsdelete.walk_within(top):
        if directory == str(top) and ".git" in dirs:
            dirs.remove(".git")
        count += len(files)
        if count >= MAX_FILES:
            return MAX_FILES, True
    return count, False


async def describe(stray: Stray, git: Git, store: Store) -> StrayInfo:
    if stray.kind == "kept":
        copy = preserved.load(Path(stray.path))
        kept = copy.files if copy is not None else []
        return StrayInfo(
            kind="kept",
            path=stray.path,
            project_id=stray.project_id,
            exists=True,
            workspace_id=stray.workspace_id,
            files=len(kept),
            kept_files=kept[:MAX_UNCOMMITTED],
            note=kept_note(store, stray)
            + ("" if copy is not None else "; its manifest is unreadable"),
        )
    path = Path(stray.path)
    exists = path.is_dir()
    info: dict[str, object] = {
        "kind": stray.kind,
        "path": stray.path,
        "project_id": stray.project_id,
        "admin_dir": stray.admin_dir,
        "exists": exists,
    }
    found = marker.read_marker(path) if exists else None
    if found is None and stray.admin_dir:
        found = marker.parse(_read(Path(stray.admin_dir) / "locked") or "")
    if found is not None:
        info["marker"] = found.reason()
        if rows.is_tombstoned(store, found.workspace_id):
            info["note"] = f"left by removed workspace {found.workspace_id}"
        elif rows.get_workspace(store, found.workspace_id) is not None:
            info["note"] = f"carries the marker of workspace {found.workspace_id} (elsewhere)"
    if stray.admin_dir and not exists:
        head = _read(Path(stray.admin_dir) / "HEAD") or ""
        if head.startswith("ref: refs/heads/"):
            info["branch"] = head[len("ref: refs/heads/") :]
        elif head:
            info["head"] = head
        info.setdefault("note", "git admin entry whose checkout is gone")
    if not exists:
        return StrayInfo.model_validate(info)
    files, truncated = await anyio.to_thread.run_sync(_count_files, path)
    info["files"], info["files_truncated"] = files, truncated
    if os.path.lexists(path / ".git"):
        branch = await git.run(path, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
        if branch.ok:
            info["branch"] = branch.output.text().strip()
        commit = await git.run(path, "rev-parse", "--verify", "--quiet", "HEAD", check=False)
        if commit.ok:
            info["head"] = commit.output.text().strip()
        status = await git.run(
            path, "status", "--porcelain=v1", "--untracked-files=all", check=False
        )
        if status.ok:
            lines = [ln[3:] for ln in status.output.text().splitlines() if len(ln) > 3]
            info["uncommitted"] = lines[:MAX_UNCOMMITTED]
        else:
            info.setdefault("note", "git status failed: " + status.describe())
    return StrayInfo.model_validate(info)
