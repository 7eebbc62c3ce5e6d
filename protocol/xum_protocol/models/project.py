"""Protocol models of the `project` domain: add, list, get, remove, trust."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from xum_protocol.methods_base import MethodSpec
from xum_protocol.models.base import Name, Params, Result

ProjectKind = Literal["git", "directory"]


class ProjectInfo(Result):
    id: str
    name: str
    path: str = Field(description="Canonical path (realpath) of the repository or directory.")
    kind: ProjectKind
    workspaces_dir: str = Field(description="Where new workspaces of this project are created.")
    trusted_config_hash: str | None = Field(
        default=None, description="sha256 of the .xum/config.toml content the user trusted."
    )
    created_at: float
    updated_at: float


class ProjectAddParams(Params):
    name_fields: ClassVar[frozenset[str]] = frozenset({"name"})

    path: str = Field(min_length=1, max_length=4096)
    name: Name | None = Field(default=None, description="Default: the directory's basename.")
    workspaces_dir: str | None = Field(
        default=None, max_length=4096, description="Default: ROOT/workspaces/<name>."
    )


class ProjectResult(Result):
    project: ProjectInfo


class ProjectListParams(Params):
    pass


class ProjectListResult(Result):
    projects: list[ProjectInfo]


class ProjectIdParams(Params):
    project_id: str = Field(min_length=1, max_length=200)


class ProjectRemoveParams(Params):
    project_id: str = Field(min_length=1, max_length=200)
    force: bool = Field(
        default=False, description="Snapshot uncommitted work first instead of refusing not_safe."
    )


class WorkspaceOutcome(Result):
    """One workspace's outcome inside project.remove: the result of the very same
    workspace.remove path, or the error it answered."""

    workspace_id: str
    name: str
    ok: bool
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class ProjectRemoveResult(Result):
    project: ProjectInfo
    removed: bool
    workspaces: list[WorkspaceOutcome]


class ProjectTrustParams(Params):
    project_id: str = Field(min_length=1, max_length=200)
    hash: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Trust exactly this config hash (as reported by an untrusted setup); "
        "default: the hash of the project's current .xum/config.toml.",
    )


class ProjectTrustResult(Result):
    project: ProjectInfo
    config_hash: str
    config_path: str


PROJECT_ADD = MethodSpec(
    "project.add", ProjectAddParams, ProjectResult, "Register a repository.", mutating=True
)
PROJECT_LIST = MethodSpec("project.list", ProjectListParams, ProjectListResult, "All projects.")
PROJECT_GET = MethodSpec("project.get", ProjectIdParams, ProjectResult, "One project.")
PROJECT_REMOVE = MethodSpec(
    "project.remove",
    ProjectRemoveParams,
    ProjectRemoveResult,
    "Remove every workspace (same path as workspace.remove), then the project.",
    mutating=True,
)
PROJECT_TRUST = MethodSpec(
    "project.trust",
    ProjectTrustParams,
    ProjectTrustResult,
    "Trust the project's .xum/config.toml (exact content hash) so its scripts run.",
    mutating=True,
)
