"""A workspace path that another workspace holds in another case.

Where the workspaces directory's filesystem ignores case (macOS by default), `Fix` and `fix`
are one directory: a workspace created or renamed to a name equal ignoring case to another
workspace's in that directory (of this project, or of another sharing the directory) would
land on that workspace's checkout. Refused `conflict` before anything is recorded; whether the
filesystem ignores case is its own answer (`checkouts.pathcase`), never assumed from the
platform. Where it tells case apart, `Fix` and `fix` are two workspaces as before.
"""

from __future__ import annotations

import os
from pathlib import Path

from xum_protocol.errors import ErrorKind

from xumd.base.errors import XumError
from xumd.checkouts import pathcase
from xumd.lifecycle import rows
from xumd.store import Store


def _same_directory(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)  # a bind mount: two canonical spellings, one directory
    except OSError:
        return False


def check_no_case_alias(store: Store, path: Path, workspace_id: str | None = None) -> None:
    """`path` (a workspace's to be, by create or rename; `workspace_id` the renamed one) is no
    other workspace's path in another case on a filesystem that ignores case."""
    directory = pathcase.canonical(path.parent)
    if not pathcase.case_insensitive(directory):
        return
    folded = pathcase.fold(path.name)
    for other in rows.workspace_summaries(store):
        taken = Path(other["path"])
        if other["id"] == workspace_id or pathcase.fold(taken.name) != folded:
            continue
        if _same_directory(pathcase.canonical(taken.parent), directory):
            raise XumError(
                ErrorKind.CONFLICT,
                f"{path} is the path of workspace {other['id']} ({taken}) in another case, and "
                f"the filesystem of {directory} does not tell names apart by case; choose "
                "another name",
                id=other["id"],
                path=str(path),
                taken=str(taken),
            )
