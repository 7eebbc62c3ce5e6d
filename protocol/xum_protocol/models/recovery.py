"""Protocol models of crash recovery: `workspace.strays`, `workspace.discard_kept`.

A stray is something under the xum root that no workspace row claims: a checkout directory, or a
git admin entry (`<repo>/.git/worktrees/<name>`) pointing into the root. The daemon lists them with
what they contain and never deletes them on its own.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from xum_protocol.methods_base import MethodSpec
from xum_protocol.models.base import Params, Result


class StrayInfo(Result):
    kind: Literal["checkout", "admin_entry", "kept"] = Field(
        description="`kept`: a copy of files a workspace was asked to preserve that no "
        "workspace claims (its workspace was removed, or the copy was set aside); "
        "`workspace.discard_kept` deletes it (since 1.0, additive)."
    )
    path: str = Field(description="The checkout directory (for an admin entry: where it points).")
    project_id: str | None = None
    admin_dir: str | None = Field(default=None, description="git's admin entry, if any.")
    exists: bool = Field(description="The checkout directory exists.")
    branch: str | None = None
    head: str | None = None
    files: int = Field(default=0, description="Files in the checkout (bounded count).")
    files_truncated: bool = False
    uncommitted: list[str] = Field(
        default_factory=list, description="Staged, unstaged and untracked paths (bounded)."
    )
    marker: str | None = Field(
        default=None, description="The xum incarnation marker it carries, if any."
    )
    note: str | None = None
    workspace_id: str | None = Field(
        default=None, description="`kept`: the workspace whose files these are."
    )
    kept_files: list[str] = Field(
        default_factory=list, description="`kept`: the files in the copy (bounded)."
    )


class StraysParams(Params):
    project_id: str | None = Field(default=None, max_length=200)


class StraysResult(Result):
    strays: list[StrayInfo]


class DiscardKeptParams(Params):
    path: str = Field(
        min_length=1, max_length=4096, description="A `kept` stray's path (`workspace.strays`)."
    )


class DiscardKeptResult(Result):
    path: str
    files: int = Field(description="Files the deleted copy held.")


WORKSPACE_STRAYS = MethodSpec(
    "workspace.strays",
    StraysParams,
    StraysResult,
    "Checkouts and git admin entries under the root that no workspace claims (never "
    "deleted), and kept copies of preserved files.",
)
WORKSPACE_DISCARD_KEPT = MethodSpec(
    "workspace.discard_kept",
    DiscardKeptParams,
    DiscardKeptResult,
    "Delete one kept copy of preserved files (a `kept` stray); nothing else.",
    mutating=True,
)
