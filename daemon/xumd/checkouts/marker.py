"""A checkout's identity: the reference a workspace row gives out (`WorkspaceRef`), and the
on-disk incarnation marker, proof that a directory is the checkout a row names.

Worktree runtime: `git worktree add --lock --reason "xum <workspace-id> <incarnation>"` writes the
reason into the worktree's admin dir (`<common-git-dir>/worktrees/<name>/locked`): atomic with the
add, invisible to `git status`, and it protects the worktree from `git worktree prune` and `git gc`.
The checkout's `.git` file points at that admin dir, so from the checkout alone we can find it.

Directory runtime: a file `.xum-incarnation` at the top of the directory holds the same line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from xumd.checkouts.adminfile import read_admin_file
from xumd.system import atomicfile

PREFIX = "xum"
DIRECTORY_MARKER = ".xum-incarnation"


@dataclass(frozen=True, slots=True)
class WorkspaceRef:
    """One materialisation of a workspace: its row's id, project, name, path and incarnation."""

    id: str
    project_id: str
    name: str
    path: Path
    incarnation: str


@dataclass(frozen=True, slots=True)
class Marker:
    workspace_id: str
    incarnation: str

    def reason(self) -> str:
        return f"{PREFIX} {self.workspace_id} {self.incarnation}"


def parse(text: str) -> Marker | None:
    parts = text.strip().split()
    if len(parts) == 3 and parts[0] == PREFIX:
        return Marker(parts[1], parts[2])
    return None


def worktree_admin_dir(checkout: Path) -> Path | None:
    """The admin dir a worktree checkout's `.git` file points to, without following symlinks
    out of the checkout (a `.git` that is a symlink or a directory is not ours)."""
    text = (read_admin_file(checkout / ".git") or "").strip()  # never a FIFO's wait
    if not text.startswith("gitdir:"):
        return None
    admin = Path(text[len("gitdir:") :].strip())
    if not admin.is_absolute():
        admin = (checkout / admin).resolve()
    return admin


def read_worktree_marker(checkout: Path) -> Marker | None:
    admin = worktree_admin_dir(checkout)
    if admin is None:
        return None
    return parse(read_admin_file(admin / "locked") or "")


def read_directory_marker(directory: Path) -> Marker | None:
    # The checkout is the user's: a FIFO or a huge file there is no marker, and never waited on.
    return parse(read_admin_file(directory / DIRECTORY_MARKER) or "")


def write_directory_marker(directory: Path, marker: Marker) -> None:
    """A crash leaves the old marker or the new one. Not durable: the directory it goes into
    was just made and is not fsynced either, so flushing the rename would not keep the checkout
    through a power loss."""
    atomicfile.write_atomic(
        directory / DIRECTORY_MARKER,
        (marker.reason() + "\n").encode(),
        durable=False,
        temp_name=f"{DIRECTORY_MARKER}.tmp",  # lifecycle/materialise.py removes a leftover by name
    )


def read_marker(path: Path) -> Marker | None:
    """Whichever marker the directory carries (worktree first)."""
    return read_worktree_marker(path) or read_directory_marker(path)
