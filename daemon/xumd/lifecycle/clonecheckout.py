"""Fill a worktree made with `--no-checkout` from a template: a copy-on-write clone of a
prepared checkout of the same tree (system/reflink.py) and an index of the template's entries
with the clone's stat data (system/indexstat.py), or git's own checkout.

The template is a checkout xum owns (nobody else writes in it: a pool entry, or a directory
kept for this under ROOT). It may be used when, checked here: its HEAD's tree is the new
worktree's; its index is that tree (the index's cache tree, `TREE`, names it at the root);
and each of its files is the one its index describes, by git's own stat test made on every
file just before it is cloned, with nothing in it the index does not list. The clone then
holds exactly what git's checkout of the tree would write, and the index git's checkout would
write, but for the stat data, which is the clone's: `git status` finds it clean without
reading a file (`tests/system/test_reflink.py` compares it with a `git worktree add` of the
same commit, file by file, and asks `git diff-files`).

Anything else (a filesystem without reflinks, another filesystem, a template that does not
match, an index this reader does not rewrite: a sparse or split index, a submodule) gives
git's checkout instead, as `git worktree add` does it (`reset --hard`), after taking back
what the clone made. The answer says which was used.

Neither create nor the warm pool's refill fills a checkout this way: on a source tree git's
checkout is per-file metadata, which the clone pays too, and `bench/clone.py` measured the fill
at 0.87x to 1.16x of `git worktree add` (docs/PERFORMANCE.md, "Copy-on-write"). What cloning
does pay for, data, is `[create] copy`'s (lifecycle/seed.py through system/fscopy.py).
"""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path
from typing import Literal

import anyio

from xumd.base import logs
from xumd.system import fsdelete, indexstat, reflink
from xumd.system.git import Git

log = logs.get("xumd.lifecycle.clonecheckout")

Materialised = Literal["git", "reflink"]


class _Stale(Exception):
    """The template is not a clean checkout of the tree (the reason is the message)."""


def _cache_tree_root(entries: indexstat.Entries) -> str | None:
    """The tree the index's cache tree names at its root (None: no valid cache tree)."""
    kept = entries.kept
    if kept[:4] != b"TREE":
        return None
    body = kept[8:]
    line_end = body.find(b"\n")
    head = body[:line_end].split(b"\0", 1)
    if len(head) != 2 or head[0] != b"":
        return None
    count = head[1].split(b" ")[0]
    if count.startswith(b"-"):
        return None  # invalidated: the index was changed after the tree was written
    return body[line_end + 1 : line_end + 21].hex()


async def _paths(git: Git, checkout: Path) -> tuple[Path, str]:
    out = await git.out(
        checkout, "rev-parse", "--path-format=absolute", "--git-path", "index", "HEAD^{tree}"
    )
    index, tree = out.splitlines()
    return Path(index), tree


def _clone(template: Path, template_index: Path, tree: str, checkout: Path, index: Path) -> None:
    entries = indexstat.read(template_index)
    if _cache_tree_root(entries) != tree:
        raise _Stale("the template's index is not its HEAD's tree (or has no cache tree)")

    def check(rel: str, st: os.stat_result) -> None:
        if not entries.unchanged(rel, st):
            raise _Stale(f"{rel} is not the file the template's index describes")

    cloned = reflink.clone_tree(template, checkout, leave_out={".git"}, check=check)
    if len(cloned) != len(entries.by_path):
        raise _Stale("the template lacks files its index lists")
    indexstat.write(entries, cloned, index)


def _take_back(checkout: Path) -> None:
    """Everything but `.git` out of the checkout (what a failed clone made)."""
    for name in os.listdir(checkout):
        if name != ".git":
            path = checkout / name
            if path.is_dir() and not path.is_symlink():
                fsdelete.remove_tree(path)
            else:
                path.unlink()


async def fill(git: Git, checkout: Path, template: Path | None) -> Materialised:
    """Write the files and the index of the `--no-checkout` worktree `checkout`: cloned from
    `template` where that holds (see the module), else by git."""
    if template is not None and await anyio.to_thread.run_sync(
        reflink.supported, template, checkout
    ):
        try:
            index, tree = await _paths(git, checkout)
            template_index, template_tree = await _paths(git, template)
            if tree != template_tree:
                raise _Stale(f"the template is at tree {template_tree}, not {tree}")
            await anyio.to_thread.run_sync(_clone, template, template_index, tree, checkout, index)
        except (_Stale, reflink.NotCloneable, indexstat.Unsupported, struct.error) as exc:
            log.info("checkout.clone_declined", checkout=str(checkout), reason=str(exc))
            await anyio.to_thread.run_sync(_take_back, checkout)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            log.warning("checkout.clone_failed", checkout=str(checkout), error=str(exc))
            await anyio.to_thread.run_sync(_take_back, checkout)
        else:
            return "reflink"
    # What `git worktree add` runs after making a worktree: the checkout of its HEAD.
    await git.run(checkout, "reset", "--hard", "--quiet", what="git checkout of the worktree")
    return "git"
