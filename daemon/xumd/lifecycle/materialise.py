"""Materialise a checkout (worktree or plain directory) with its incarnation marker, and take
back exactly one that this operation made (the undo of a failed create or unarchive).

Git admin operations run under `git.admin_lock(repo)`: concurrent `git worktree add` in one
repository trips git's own locks otherwise.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import anyio
from xum_protocol.errors import ErrorKind

from xumd.base import logs
from xumd.base.errors import XumError
from xumd.checkouts import marker
from xumd.checkouts.adminfile import read_admin_file
from xumd.lifecycle.rows import WorkspaceRow
from xumd.system import diskfull, fsdelete, gitlocks
from xumd.system.git import Git, GitError

log = logs.get("xumd.lifecycle.materialise")


async def clear_stale_locks(git: Git, repo: Path) -> list[str]:
    """Under the repo's admin lock: clear provably stale git lock files, report them."""
    common = await git.out(repo, "rev-parse", "--path-format=absolute", "--git-common-dir")
    return gitlocks.clear_stale(Path(common)).cleared


class BranchTaken(XumError):
    """`add -b` refused before git ran: the branch exists now (another create made it since this
    one planned it as new). The failed create's undo must leave it alone: it is not ours."""


async def add_worktree(
    git: Git,
    repo: Path,
    row: WorkspaceRow,
    branch: str,
    new_from: str | None,
    *,
    no_checkout: bool = False,
) -> list[str]:
    """`git worktree add --lock --reason <marker>`: the lock is atomic with the add and its
    reason is the incarnation marker. With `new_from`, the branch is created (-b). Returns the
    stale git lock files cleared first. `no_checkout`: no file is written (a sparse checkout
    writes its cone afterwards: bigrepo.apply_sparse)."""
    reason = marker.Marker(row.id, row.incarnation).reason()
    args = ["worktree", "add", "--lock", "--reason", reason]
    if no_checkout:
        args.append("--no-checkout")
    if new_from is not None:
        args += ["-b", branch, "--", str(row.path), new_from]
    else:
        args += ["--", str(row.path), branch]
    async with git.admin_lock(repo):
        # One git process: the common dir (for the stale locks), and for a new branch whether
        # it exists now, re-checked under the admin lock (every branch-making operation of the
        # daemon takes it): a branch found after a failed `add -b` below is then this add's own.
        common, taken = await _common_dir_and_branch(
            git, repo, branch if new_from is not None else None
        )
        if taken:
            raise BranchTaken(
                ErrorKind.CONFLICT,
                f"branch {branch!r} was created meanwhile (by another create?); pick another",
                branch=branch,
            )
        cleared = gitlocks.clear_stale(common).cleared
        await git.run(repo, *args, what="git worktree add")
    return cleared


async def _common_dir_and_branch(git: Git, repo: Path, branch: str | None) -> tuple[Path, bool]:
    """`rev-parse --git-common-dir [--verify --quiet refs/heads/<branch>]`: git prints the
    common dir first, then exits 1 (no other output) when the branch does not exist."""
    args = ["rev-parse", "--path-format=absolute", "--git-common-dir"]
    if branch is not None:
        args += ["--verify", "--quiet", f"refs/heads/{branch}"]
    result = await git.run(repo, *args, check=False)
    lines = result.output.text().splitlines()
    answered = result.ok or (branch is not None and result.returncode == 1)
    if not answered or not lines or not os.path.isabs(lines[0]):
        raise GitError(result, "git rev-parse --git-common-dir")
    return Path(lines[0]), branch is not None and result.ok


async def drop_stale_admin_entry(git: Git, repo: Path, row: WorkspaceRow) -> str | None:
    """Before a worktree is recreated at `row.path` (which is missing): drop git's admin entry
    that still registers that path, when its lock reason is a marker of this workspace. A
    checkout deleted by hand keeps its entry, and xum's lock keeps `prune` from taking it, so
    `git worktree add` would refuse the path ("missing but locked"). The row is archived, so no
    incarnation of it is live: the entry is a leftover of ours, as the cleanup's trash step
    would drop it. Another entry registering the path is the user's to settle: `conflict` with
    the way out. Returns the admin dir dropped, if any."""
    if os.path.lexists(row.path):
        return None
    common = Path(await git.out(repo, "rev-parse", "--path-format=absolute", "--git-common-dir"))
    wanted = {str(row.path / ".git"), os.path.join(os.path.realpath(row.path), ".git")}
    async with git.admin_lock(repo):
        try:
            entries = sorted(os.scandir(common / "worktrees"), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return None
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            admin = Path(entry.path)
            gitdir = read_admin_file(admin / "gitdir")
            if gitdir is None or gitdir.strip() not in wanted:
                continue
            found = marker.parse(read_admin_file(admin / "locked") or "")
            if found is None or found.workspace_id != row.id:
                raise XumError(
                    ErrorKind.CONFLICT,
                    f"git's admin entry {admin} still registers {row.path} (not a checkout of "
                    f"{row.id}); run `git worktree prune` in {repo} (after `git worktree unlock "
                    f"{row.path}` if it is locked), then unarchive again",
                    path=str(row.path),
                    admin_dir=str(admin),
                )
            fsdelete.remove_tree(admin)
            return str(admin)
    return None


def make_directory(row: WorkspaceRow) -> None:
    """The directory runtime's checkout: a plain directory carrying the marker file."""
    row.path.mkdir()
    try:
        marker.write_directory_marker(row.path, marker.Marker(row.id, row.incarnation))
    except BaseException as exc:
        # Without its marker the directory cannot be proven ours later, so the undo would
        # leave it at the path (a later unarchive or create: "exists"). It is ours now and
        # empty but for the marker's temporary file: take it back (rmdir: only if empty).
        with contextlib.suppress(OSError):
            (row.path / f"{marker.DIRECTORY_MARKER}.tmp").unlink(missing_ok=True)
            row.path.rmdir()
        if isinstance(exc, OSError) and diskfull.is_no_space_oserror(exc):
            raise diskfull.disk_full(
                row.path, f"the marker file of {row.path}", exc.strerror
            ) from exc
        raise


async def discard(git: Git, repo: Path, row: WorkspaceRow) -> None:
    """Take back the checkout this operation made for `row` (marker-checked): a worktree and
    git's admin entry, or a directory. Anything else at the path is left alone, and so is a
    checkout with a mount at or under it (`git worktree remove` would empty the mount)."""
    mounts = fsdelete.mounts_at_or_under(row.path)
    if mounts:
        log.warning("checkout.discard_left", workspace=row.id, mounts=mounts[:5])
        return
    if row.runtime == "worktree":
        async with git.admin_lock(repo):
            found = marker.read_worktree_marker(row.path)
            # `remove -f -f` also drops the admin entry of a locked worktree whose directory
            # is gone (a prune would touch the user's other stale entries too).
            if found == marker.Marker(row.id, row.incarnation) or not os.path.lexists(row.path):
                # The tree goes through our own walk (by descriptor, stopping at any mount that
                # appeared since the check above); git then only drops its admin entry.
                if not await _delete_checkout(row):
                    return
                await git.run(
                    repo, "worktree", "remove", "--force", "--force", str(row.path), check=False
                )
    elif row.path.is_dir() and marker.read_directory_marker(row.path) == marker.Marker(
        row.id, row.incarnation
    ):
        await _delete_checkout(row)


async def _delete_checkout(row: WorkspaceRow) -> bool:
    """Delete the checkout's tree with the mount-bounded primitive; False (logged) when
    something was left: a mount, or an error."""
    try:
        left = await anyio.to_thread.run_sync(fsdelete.remove_tree, row.path)
    except OSError as exc:
        log.warning("checkout.discard_failed", workspace=row.id, error=str(exc))
        return False
    if left:
        log.warning("checkout.discard_left", workspace=row.id, mounts=left[:5])
    return not left
