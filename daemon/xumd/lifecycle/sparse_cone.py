"""A sparse workspace stays sparse across archive and unarchive.

Which cone: the workspace's OWN cone as it was when it was archived, recorded then
(`workspace_sparse`), not the main checkout's cone re-read at unarchive. The snapshot holds the
workspace's files, so its own cone is what gives the user back what they had: the user may have
widened it in the workspace (`git sparse-checkout add`), or changed or dropped the main
checkout's cone since the create. A workspace archived with no cone recorded (a full checkout,
or one archived before this was recorded) comes back full: a full checkout loses nothing. (Git
itself copies the sparse settings of the checkout `git worktree add` runs in, the main one, into
the new checkout since 2.36 or so: that inherited cone is disabled then, not kept by accident.)

Nothing restored is dropped: the snapshot and the preserved files are restored into a full
checkout first; then every path that carries the user's work (modified, staged, deleted,
untracked, or a preserved ignored file) and lies outside the cone keeps its directory in the
cone (the cone is widened by that directory, never narrowed over the work) and is reported
(`restored.sparse_kept`). Only clean tracked files outside the cone leave the disk, which git
can write back at any time.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

from xum_protocol.models.checkout_extras import SparseInfo

from xumd.base import logs
from xumd.lifecycle import bigrepo
from xumd.lifecycle.seed import git_list
from xumd.store import Store
from xumd.system.git import Git

log = logs.get("xumd.lifecycle.sparse_cone")


def record(store: Store, workspace_id: str, sparse: SparseInfo | None) -> None:
    """Inside the archive's commit transaction: the cone to re-apply at unarchive (or none)."""
    store.execute("DELETE FROM workspace_sparse WHERE workspace_id = ?", (workspace_id,))
    if sparse is not None:
        store.execute(
            "INSERT INTO workspace_sparse (workspace_id, patterns) VALUES (?, ?)",
            (workspace_id, json.dumps(sparse.patterns)),
        )


def recorded(store: Store, workspace_id: str) -> SparseInfo | None:
    row = store.one("SELECT patterns FROM workspace_sparse WHERE workspace_id = ?", (workspace_id,))
    if row is None:
        return None
    try:
        value = json.loads(row["patterns"])
    except ValueError:
        return None
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        return None
    return SparseInfo(cone=True, patterns=value)


def in_cone(path: str, cones: list[str]) -> bool:
    """Whether cone mode checks `path` out: a file at the top, a file directly in a directory
    leading to a cone directory, or anything under a cone directory."""
    parent = posixpath.dirname(path)
    if not parent:
        return True
    for listed in cones:
        cone = listed.strip("/")
        if path.startswith(cone + "/") or cone == parent or cone.startswith(parent + "/"):
            return True
    return False


async def _work_paths(git: Git, checkout: Path) -> list[str]:
    """Every path of the checkout that differs from HEAD (tracked changes either side of the
    index, deletions, untracked files one by one)."""
    listed = await git_list(
        git,
        checkout,
        ["status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames"],
        what="the checkout's changed paths",
        too_many="the checkout's changes are too many to list",
    )
    return [entry[3:] for entry in listed if len(entry) > 3]


async def reapply(
    git: Git, repo: Path, checkout: Path, sparse: SparseInfo, preserved: list[str]
) -> tuple[SparseInfo, list[str]]:
    """After the restore: set the cone, widened by the directory of each path outside it that
    carries work. Returns the cone applied and those paths (sorted)."""
    work = [*await _work_paths(git, checkout), *preserved]
    kept = sorted({p for p in work if not in_cone(p, sparse.patterns)})
    cones = list(sparse.patterns)
    for path in kept:
        parent = posixpath.dirname(path)
        if parent and not in_cone(path, cones):
            cones.append(parent)
    applied = SparseInfo(cone=True, patterns=cones)
    await bigrepo.set_cone(git, repo, checkout, applied.patterns)
    if kept:
        log.warning("workspace.sparse_kept", checkout=str(checkout), files=len(kept))
    return applied, kept


async def unsparse(git: Git, repo: Path, checkout: Path) -> None:
    """No cone recorded: a full checkout, whatever `git worktree add` copied from the main one."""
    enabled = await git.run(checkout, "config", "--bool", "core.sparseCheckout", check=False)
    if not enabled.ok or enabled.output.text().strip() != "true":
        return
    async with git.admin_lock(repo):
        await git.run(checkout, "sparse-checkout", "disable", what="git sparse-checkout disable")
