"""Projects: a repository (or plain directory) registered with the daemon.

The canonical path is the realpath, and the filesystem identity (st_dev, st_ino) is recorded too,
so adding one repository twice through a symlink, `..` or a bind-mount spelling is a `conflict`
naming the existing project. Removing a project removes each workspace through the very same
`WorkspaceService.remove` path as a direct call, and never touches the repository itself.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING

from xum_protocol.errors import ErrorKind
from xum_protocol.models.project import (
    ProjectAddParams,
    ProjectInfo,
    ProjectRemoveResult,
    ProjectTrustResult,
    WorkspaceOutcome,
)

from xumd import logs
from xumd.errors import XumError
from xumd.git import Git
from xumd.lifecycle import ids, rows, views
from xumd.lifecycle.context import require_project
from xumd.lifecycle.coordinator import Coordinator
from xumd.lifecycle.rows import ProjectRow
from xumd.lifecycle.scripts import config_file, load_config

if TYPE_CHECKING:
    from xumd.app import App
    from xumd.lifecycle.service import WorkspaceService

log = logs.get("xumd.lifecycle.projects")


class ProjectService:
    def __init__(self, app: App, coord: Coordinator, git: Git, workspaces: WorkspaceService):
        self.app = app
        self.store = app.store
        self.coord = coord
        self.git = git
        self.workspaces = workspaces

    def info(self, project: ProjectRow) -> ProjectInfo:
        return views.project_info(project, self.app.paths.workspaces)

    def get(self, project_id: str) -> ProjectRow:
        return require_project(self.store, project_id)

    async def add(self, params: ProjectAddParams) -> ProjectRow:
        raw = params.path
        if "\0" in raw or not os.path.isabs(raw):
            raise XumError(ErrorKind.INVALID_PATH, f"{raw!r} is not an absolute path", path=raw)
        real = Path(os.path.realpath(raw))
        if not real.is_dir():
            raise XumError(ErrorKind.INVALID_PATH, f"{raw} is not a directory", path=raw)
        st = real.stat()
        kind = await self._kind(real)
        name = params.name or real.name
        ids.check_name(name, "project")
        for other in rows.list_projects(self.store):
            if other.path == real or (other.dev, other.ino) == (st.st_dev, st.st_ino):
                raise XumError(
                    ErrorKind.CONFLICT,
                    f"{raw} is already registered as project {other.name!r} ({other.id})",
                    id=other.id,
                    name=other.name,
                )
            if other.name == name:
                raise XumError(
                    ErrorKind.CONFLICT,
                    f"a project named {name!r} already exists ({other.id}); pass another name",
                    id=other.id,
                    name=name,
                )
        workspaces_dir = None
        if params.workspaces_dir is not None:
            if not os.path.isabs(params.workspaces_dir):
                raise XumError(
                    ErrorKind.INVALID_PATH,
                    f"workspaces_dir {params.workspaces_dir!r} is not an absolute path",
                )
            workspaces_dir = os.path.realpath(params.workspaces_dir)
        project_id = ids.new_id(ids.PROJECT)
        now = time.time()
        try:
            with self.store.transaction():
                self.store.execute(
                    "INSERT INTO projects (id, name, path, dev, ino, kind, workspaces_dir,"
                    " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        project_id,
                        name,
                        str(real),
                        st.st_dev,
                        st.st_ino,
                        kind,
                        workspaces_dir,
                        now,
                        now,
                    ),
                )
        except sqlite3.IntegrityError:
            raise XumError(
                ErrorKind.CONFLICT, f"{raw} or the name {name!r} is already registered"
            ) from None
        project = self.get(project_id)
        self.app.events.publish("project.added", project=self.info(project).model_dump(mode="json"))
        log.info("project.added", project=project_id, path=str(real), kind=kind)
        return project

    async def _kind(self, path: Path) -> str:
        result = await self.git.run(path, "rev-parse", "--show-toplevel", check=False)
        if not result.ok:
            return "directory"
        top = os.path.realpath(result.output.text().strip())
        if top != str(path):
            raise XumError(
                ErrorKind.INVALID_PATH,
                f"{path} is inside the git repository {top}; add the repository itself",
                path=str(path),
                repository=top,
            )
        return "git"

    def trust(self, project_id: str, digest: str | None) -> ProjectTrustResult:
        project = self.get(project_id)
        found = config_file(project.path)
        if digest is None:
            if found is None:
                raise XumError(
                    ErrorKind.INVALID_STATE,
                    f"{project.path} has no .xum/config.toml to trust",
                )
            try:
                digest = load_config(found).hash
            except OSError as exc:
                raise XumError(ErrorKind.OPERATION_FAILED, f"cannot read {found}: {exc}") from None
        with self.store.transaction():
            self.store.execute(
                "UPDATE projects SET trusted_config_hash = ?, updated_at = ? WHERE id = ?",
                (digest, time.time(), project.id),
            )
        project = self.get(project.id)
        self.app.events.publish(
            "project.trusted", project=self.info(project).model_dump(mode="json")
        )
        return ProjectTrustResult(
            project=self.info(project),
            config_hash=digest,
            config_path=str(found or project.path / ".xum" / "config.toml"),
        )

    async def remove(self, project_id: str, force: bool) -> ProjectRemoveResult:
        project = self.get(project_id)
        outcomes: list[WorkspaceOutcome] = []
        async with self.coord.project_exclusive(project.id, "remove"):
            project = self.get(project_id)
            for ws in rows.list_workspaces(self.store, project.id):
                try:
                    result = await self.workspaces.remove(ws.id, force=force)
                except XumError as exc:
                    outcomes.append(
                        WorkspaceOutcome(
                            workspace_id=ws.id,
                            name=ws.name,
                            ok=False,
                            error={"kind": exc.kind.value, "message": exc.message, **exc.data},
                        )
                    )
                else:
                    outcomes.append(
                        WorkspaceOutcome(
                            workspace_id=ws.id,
                            name=ws.name,
                            ok=True,
                            result=result.model_dump(mode="json"),
                        )
                    )
            failed = [o for o in outcomes if not o.ok]
            if failed:
                first = failed[0].error or {}
                kind = ErrorKind(first.get("kind", ErrorKind.OPERATION_FAILED.value))
                raise XumError(
                    kind,
                    f"project {project.name!r} not removed: {len(failed)} of {len(outcomes)} "
                    f"workspace(s) could not be removed; first: {failed[0].name!r}: "
                    f"{first.get('message')}",
                    workspaces=[o.model_dump(mode="json") for o in outcomes],
                )
            with self.store.transaction():
                self.store.execute("DELETE FROM projects WHERE id = ?", (project.id,))
        self.app.events.publish("project.removed", project_id=project.id, name=project.name)
        log.info("project.removed", project=project.id)
        return ProjectRemoveResult(project=self.info(project), removed=True, workspaces=outcomes)
