"""A pool entry on disk: made, proven, checked, handed to a workspace, dropped.

An entry is a detached worktree at `<workspaces_dir>/.xum-pool/<entry-id>` (`.xum-pool` is no
valid workspace name, so no workspace path lands in it), added with `--lock --reason
"xum-pool <entry-id> <incarnation>"`: the pool's marker, in git's admin dir as a workspace's is
(checkouts/marker.py), and no workspace marker (`marker.parse` refuses it). The admin dir is
`<common>/worktrees/<entry-id>` (git names it after the checkout's basename, and entry ids are
unique), so a partial checkout whose `.git` file was never written (or was deleted first by an
interrupted drop) is still proven the entry's by that admin dir.

The takeover: rename the directory to the workspace's path (one filesystem: the pool lives in
the workspaces directory), the admin dir's `gitdir` rewritten to the new path (what
`git worktree repair` does; `worktree move` refuses a checkout with submodules), the workspace's
marker written over the pool's (durable), then the branch at the entry's commit
(`update-ref` that may only create, then `symbolic-ref HEAD`): no file of the checkout is
written, and the index stays as the entry's preparation left it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.checkout_extras import SparseInfo

from xumd.base import logs
from xumd.checkouts import marker
from xumd.checkouts.adminfile import read_admin_file
from xumd.lifecycle import bigrepo
from xumd.lifecycle.materialise import BranchTaken
from xumd.lifecycle.pool.records import EntryRow
from xumd.system import atomicfile, fsdelete, gitlocks
from xumd.system.git import Git

log = logs.get("xumd.lifecycle.pool")

POOL_DIR = ".xum-pool"
POOL_PREFIX = "xum-pool"


@dataclass(frozen=True, slots=True)
class PoolMarker:
    entry_id: str
    incarnation: str

    def reason(self) -> str:
        return f"{POOL_PREFIX} {self.entry_id} {self.incarnation}"


def parse(text: str) -> PoolMarker | None:
    parts = text.strip().split()
    if len(parts) == 3 and parts[0] == POOL_PREFIX:
        return PoolMarker(parts[1], parts[2])
    return None


def of(entry: EntryRow) -> PoolMarker:
    return PoolMarker(entry.id, entry.incarnation)


def pool_dir(workspaces_dir: Path) -> Path:
    return workspaces_dir / POOL_DIR


async def common_dir(git: Git, repo: Path) -> Path:
    return Path(await git.out(repo, "rev-parse", "--path-format=absolute", "--git-common-dir"))


def _admin(common: Path, entry: EntryRow) -> Path:
    return common / "worktrees" / entry.id


def proven_admin(common: Path, entry: EntryRow, at: Path) -> bool:
    """Git's admin dir of the entry registers `at` and carries the entry's marker."""
    admin = _admin(common, entry)
    gitdir = (read_admin_file(admin / "gitdir") or "").strip()
    wanted = {str(at / ".git"), os.path.join(os.path.realpath(at), ".git")}
    return gitdir in wanted and parse(read_admin_file(admin / "locked") or "") == of(entry)


def marker_at(path: Path) -> PoolMarker | None:
    admin = marker.worktree_admin_dir(path)
    return parse(read_admin_file(admin / "locked") or "") if admin is not None else None


async def prepare(git: Git, repo: Path, entry: EntryRow, sparse: SparseInfo | None) -> None:
    """`git worktree add --detach --lock --reason <pool marker>` at the entry's commit, with the
    main checkout's cone as a fresh create applies it (lifecycle/bigrepo.py). Submodules are not
    initialised here: a submodule's git dir names its checkout by a relative path, which the
    takeover's rename would break; the create initialises them at the workspace's path."""
    entry.path.parent.mkdir(parents=True, exist_ok=True)
    args = ["worktree", "add", "--detach", "--lock", "--reason", of(entry).reason()]
    if sparse is not None:
        args.append("--no-checkout")
    args += ["--", str(entry.path), entry.base_commit]
    async with git.admin_lock(repo):
        gitlocks.clear_stale(await common_dir(git, repo))
        await git.run(repo, *args, what="git worktree add (pool entry)")
    if sparse is not None:
        await bigrepo.apply_sparse(git, repo, entry.path, sparse)


async def check(git: Git, path: Path, commit: str, timeout_s: float) -> str | None:
    """None when the checkout is at `commit` (detached) and clean, untracked files included;
    else why not. One `git status`, bounded by `timeout_s` (a timeout is a reason)."""
    result = await git.run(
        path,
        "status",
        "--porcelain=v2",
        "--branch",
        "-z",
        "--untracked-files=all",
        timeout_s=timeout_s,
        check=False,
    )
    if not result.ok:
        return f"its status is unknown ({result.describe()})"
    records = [r for r in result.output.text().split("\0") if r]
    head = next((r.split()[-1] for r in records if r.startswith("# branch.oid ")), None)
    if head != commit:
        return f"its HEAD is {head}, not {commit}"
    changed = [r for r in records if not r.startswith("#")]
    if changed or result.output.dropped:
        return f"{len(changed)} changed or untracked path(s)"
    return None


def take_over(entry: EntryRow, dest: Path) -> Path:
    """Rename the entry's checkout to `dest` and point git's admin entry at it (what
    `git worktree repair` writes: the checkout's `.git` names the admin dir, which does not
    move). Returns the admin dir. The caller holds `dest`'s directory exclusion and checked
    that nothing is there. No git process and no admin lock: only this worktree's own files
    change, each by an atomic rename."""
    admin = marker.worktree_admin_dir(entry.path)
    if admin is None or not admin.is_dir():
        raise FileNotFoundError(f"{entry.path} has no git admin dir")
    os.rename(entry.path, dest)
    point_admin_at(admin, dest)
    return admin


def point_admin_at(admin: Path, checkout: Path) -> None:
    """Not durable alone: the marker written next into the same directory is, and its
    fsync of that directory carries this rename too."""
    atomicfile.write_atomic(admin / "gitdir", f"{checkout / '.git'}\n".encode(), durable=False)


def write_workspace_marker(admin: Path, workspace: marker.Marker) -> None:
    """The checkout becomes the workspace's: its lock reason is the workspace's marker."""
    atomicfile.write_atomic(admin / "locked", (workspace.reason() + "\n").encode(), durable=True)


async def set_branch(git: Git, checkout: Path, branch: str, commit: str) -> None:
    """Create `branch` at `commit` (never moving an existing one: `update-ref` with the empty
    old value creates or fails, atomically under git's own ref lock) and point HEAD at it."""
    ref = f"refs/heads/{branch}"
    made = await git.run(
        checkout, "update-ref", "-m", f"branch: Created from {commit}", ref, commit, "", check=False
    )
    if not made.ok:
        raise BranchTaken(
            ErrorKind.CONFLICT,
            f"branch {branch!r} was created meanwhile (by another create?); pick another",
            branch=branch,
        )
    await git.run(checkout, "symbolic-ref", HEAD_REF, ref, what="git symbolic-ref HEAD")


HEAD_REF = "HEAD"


async def drop(git: Git, repo: Path | None, entry: EntryRow, at: Path | None = None) -> bool:
    """Delete the entry's checkout at `at` (default: its own path), then git's admin dir of it
    (what `git worktree remove` deletes), each only when proven the entry's: the marker through
    the checkout's `.git`, or the admin dir that registers the path. `repo` None (the project is
    gone): the admin dir is found through the checkout. True when nothing of it is left;
    anything unproven is left alone and logged."""
    where = at or entry.path
    common = await _common_or_none(git, repo)
    admin = _admin(common, entry) if common is not None else None
    present = os.path.lexists(where)
    proven = False
    if present and marker_at(where) == of(entry):
        proven = True
        admin = admin or marker.worktree_admin_dir(where)
    elif present and common is not None:
        proven = proven_admin(common, entry, where)
    if present and not proven:
        log.warning("pool.entry_left", entry=entry.id, path=str(where), why="not proven ours")
        return False
    if present:
        mounts = fsdelete.mounts_at_or_under(where)
        if mounts:
            log.warning("pool.entry_left", entry=entry.id, path=str(where), mounts=mounts[:5])
            return False
        left = await anyio.to_thread.run_sync(fsdelete.remove_tree, where)
        if left:
            log.warning("pool.entry_left", entry=entry.id, path=str(where), mounts=left[:5])
            return False
    if admin is not None and parse(read_admin_file(admin / "locked") or "") == of(entry):
        async with git.admin_lock(repo or admin.parent.parent):
            await anyio.to_thread.run_sync(fsdelete.remove_tree, admin)
    return True


async def _common_or_none(git: Git, repo: Path | None) -> Path | None:
    if repo is None or not repo.is_dir():
        return None
    result = await git.run(
        repo, "rev-parse", "--path-format=absolute", "--git-common-dir", check=False
    )
    text = result.output.text().strip()
    return Path(text) if result.ok and os.path.isabs(text) else None
