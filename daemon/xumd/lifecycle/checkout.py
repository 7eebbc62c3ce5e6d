"""Materialise a checkout (worktree or plain directory) with its incarnation marker, and take
back exactly one that this operation made (the undo of a failed create or unarchive).

Git admin operations run under `git.admin_lock(repo)`: concurrent `git worktree add` in one
repository trips git's own locks otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from xum_protocol.errors import ErrorKind

from xumd import diskfull
from xumd.errors import XumError
from xumd.git import Git
from xumd.lifecycle import gitlocks, marker
from xumd.lifecycle.rows import WorkspaceRow


async def clear_stale_locks(git: Git, repo: Path) -> list[str]:
    """Under the repo's admin lock: clear provably stale git lock files, report them."""
    common = await git.out(repo, "rev-parse", "--path-format=absolute", "--git-common-dir")
    return gitlocks.clear_stale(Path(common)).cleared


class BranchTaken(XumError):
    """`add -b` refused before git ran: the branch exists now (another create made it since this
    one planned it as new). The failed create's undo must leave it alone: it is not ours."""


async def add_worktree(
    git: Git, repo: Path, row: WorkspaceRow, branch: str, new_from: str | None
) -> list[str]:
    """`git worktree add --lock --reason <marker>`: the lock is atomic with the add and its
    reason is the incarnation marker. With `new_from`, the branch is created (-b). Returns the
    stale git lock files cleared first."""
    reason = marker.Marker(row.id, row.incarnation).reason()
    args = ["worktree", "add", "--lock", "--reason", reason]
    if new_from is not None:
        args += ["-b", branch, "--", str(row.path), new_from]
    else:
        args += ["--", str(row.path), branch]
    async with git.admin_lock(repo):
        if new_from is not None:
            # Re-checked under the admin lock (every branch-making operation of the daemon takes
            # it): a branch found after a failed `add -b` below is then this add's own.
            taken = await git.run(
                repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False
            )
            if taken.ok:
                raise BranchTaken(
                    ErrorKind.CONFLICT,
                    f"branch {branch!r} was created meanwhile (by another create?); pick another",
                    branch=branch,
                )
        cleared = await clear_stale_locks(git, repo)
        await git.run(repo, *args, what="git worktree add")
    return cleared


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
    git's admin entry, or a directory. Anything else at the path is left alone."""
    if row.runtime == "worktree":
        async with git.admin_lock(repo):
            found = marker.read_worktree_marker(row.path)
            # `remove -f -f` also drops the admin entry of a locked worktree whose directory
            # is gone (a prune would touch the user's other stale entries too).
            if found == marker.Marker(row.id, row.incarnation) or not os.path.lexists(row.path):
                await git.run(
                    repo, "worktree", "remove", "--force", "--force", str(row.path), check=False
                )
    elif row.path.is_dir() and marker.read_directory_marker(row.path) == marker.Marker(
        row.id, row.incarnation
    ):
        shutil.rmtree(row.path, ignore_errors=True)
