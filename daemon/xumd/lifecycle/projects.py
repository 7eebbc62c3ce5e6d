"""Projects: a repository (or plain directory) registered with the daemon.

The canonical path is the realpath with each existing component spelled as stored
(`checkouts.pathcase`), and the filesystem identity (st_dev, st_ino) is recorded too, so adding
one repository twice through a symlink, `..`, a bind-mount or (where the filesystem ignores
case) another case's spelling is a `conflict` naming the existing project. Removing a project
reserves and checks every workspace first (one refusal removes nothing), then removes each
through the very same path as `workspace.remove`, and never touches the repository itself.
"""

from __future__ import annotations

import os
import sqlite3
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
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

from xumd.base import logs
from xumd.base.errors import XumError
from xumd.base.requestcut import answer_if_cut
from xumd.checkouts import pathcase
from xumd.lifecycle import ids, owned, rows, views
from xumd.lifecycle import remove as removal
from xumd.lifecycle.context import require_project
from xumd.lifecycle.coordinator import Coordinator
from xumd.lifecycle.rows import ProjectRow
from xumd.lifecycle.scripts import config_file, load_config
from xumd.system.git import Git

if TYPE_CHECKING:
    from xumd.app import App
    from xumd.lifecycle.context import Context

log = logs.get("xumd.lifecycle.projects")


@dataclass(frozen=True, slots=True)
class GitIdentity:
    """A repository's git common dir: its realpath and filesystem identity."""

    path: str
    dev: int
    ino: int

    def same(self, other: GitIdentity | None) -> bool:
        return other is not None and (
            other.path == self.path or (other.dev, other.ino) == (self.dev, self.ino)
        )


def failed_outcome(workspace_id: str, name: str, exc: XumError) -> WorkspaceOutcome:
    """One workspace of a `project.remove` that was refused or failed, with its error."""
    return WorkspaceOutcome(
        workspace_id=workspace_id,
        name=name,
        ok=False,
        error={"kind": exc.kind.value, "message": exc.message, **exc.data},
    )


def _refusal(project: ProjectRow, refused: list[tuple[str, str, XumError]]) -> XumError:
    """One error naming every workspace that refused (and every holder), nothing removed."""
    kinds = [exc.kind for _, _, exc in refused]
    kind = ErrorKind.BUSY if ErrorKind.BUSY in kinds else kinds[0]
    holders = [
        {**holder, "workspace_id": wid, "workspace": name}
        for wid, name, exc in refused
        for holder in exc.data.get("holders", [])
    ]
    named = "; ".join(f"{name!r}: {exc.message}" for _, name, exc in refused)
    outcomes = [
        failed_outcome(wid, name, exc).model_dump(mode="json") for wid, name, exc in refused
    ]
    return XumError(
        kind,
        f"project {project.name!r} not removed, nor any of its workspaces: "
        f"{len(refused)} refused: {named}",
        holders=holders,
        workspaces=outcomes,
    )


def _registered(raw: str, other: ProjectRow, **data: str) -> XumError:
    through = f" (the same git repository {data['repository']})" if data else ""
    gone = ""
    if not os.path.lexists(other.path):
        # Known by its inode, the directory at the old path is gone: either it moved here, or
        # it was deleted and a new directory got its inode number. Say which to check.
        gone = (
            f"; that project's path {other.path} is gone: if the directory moved here, it is "
            f"the same project; if it was deleted, remove the project first "
            f"(xum project rm {other.name})"
        )
    return XumError(
        ErrorKind.CONFLICT,
        f"{raw} is already registered as project {other.name!r} ({other.id}){through}{gone}",
        id=other.id,
        name=other.name,
        **data,
    )


class ProjectService:
    def __init__(self, app: App, coord: Coordinator, git: Git, workspaces: Context):
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
        if params.name is not None:
            ids.check_name(params.name, "project")
        if "\0" in raw or not os.path.isabs(raw):
            raise XumError(ErrorKind.INVALID_PATH, f"{raw!r} is not an absolute path", path=raw)
        real = pathcase.canonical(raw)
        if not real.is_dir():
            raise XumError(ErrorKind.INVALID_PATH, f"{raw} is not a directory", path=raw)
        st = real.stat()
        projects = rows.list_projects(self.store)
        owned.check_project_path(real, self.app.paths, projects)
        await self._refuse_git_dir(real)
        kind = await self._kind(real)
        repo = await self._git_identity(real) if kind == "git" else None
        name = params.name if params.name is not None else real.name
        ids.check_name(name, "project")
        for other in projects:
            if other.path == real or (other.dev, other.ino) == (st.st_dev, st.st_ino):
                raise _registered(raw, other)
            if repo is not None and repo.same(await self._recorded_identity(other)):
                raise _registered(raw, other, repository=repo.path)
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
            workspaces_dir = str(pathcase.canonical(params.workspaces_dir))
        owned.check_workspaces_dir(
            Path(workspaces_dir)
            if workspaces_dir
            else owned.real(self.app.paths.workspaces) / name,
            real,
            Path(repo.path) if repo else None,
            self.app.paths,
            projects,
        )
        project_id = ids.new_id(ids.PROJECT)
        now = time.time()
        try:
            with self.store.transaction():
                rows.insert_project(
                    self.store,
                    project_id,
                    name=name,
                    path=str(real),
                    dev=st.st_dev,
                    ino=st.st_ino,
                    kind=kind,
                    workspaces_dir=workspaces_dir,
                    git=(repo.path, repo.dev, repo.ino) if repo else None,
                    now=now,
                )
        except sqlite3.IntegrityError:
            # Another add won the race after our checks (the unique indexes say which).
            raise XumError(
                ErrorKind.CONFLICT,
                f"{raw}, its repository or the name {name!r} is already registered",
            ) from None
        project = self.get(project_id)
        self.app.events.publish("project.added", project=self.info(project).model_dump(mode="json"))
        log.info("project.added", project=project_id, path=str(real), kind=kind)
        return project

    async def _refuse_git_dir(self, path: Path) -> None:
        """`REPO/.git` (or anything in it, or a bare repository) is git's own directory: as a
        plain-directory project its workspaces would copy and rewrite git's internals."""
        result = await self.git.run(path, "rev-parse", "--is-inside-git-dir", check=False)
        if result.ok and result.output.text().strip() == "true":
            raise XumError(
                ErrorKind.INVALID_PATH,
                f"{path} is a git directory (or inside one); add the repository's working "
                "tree instead; paths the daemon owns are never user paths",
                path=str(path),
            )

    async def _kind(self, path: Path) -> str:
        result = await self.git.run(path, "rev-parse", "--show-toplevel", check=False)
        if not result.ok:
            return "directory"
        top = str(pathcase.canonical(result.output.text().strip()))
        if top != str(path):
            raise XumError(
                ErrorKind.INVALID_PATH,
                f"{path} is inside the git repository {top}; add the repository itself",
                path=str(path),
                repository=top,
            )
        return "git"

    async def _git_identity(self, path: Path) -> GitIdentity:
        """The repository behind `path`: its git common dir, whatever `.git` file or linked
        worktree leads there (two projects on one repository would fight over its worktrees
        and `xum/<name>` branches)."""
        result = await self.git.run(
            path, "rev-parse", "--path-format=absolute", "--git-common-dir", check=False
        )
        common = result.output.text().strip() if result.ok else ""
        try:
            real = str(pathcase.canonical(common)) if common else ""
            st = os.stat(real) if real else None
        except OSError:
            st = None
        if st is None:
            raise XumError(
                ErrorKind.OPERATION_FAILED,
                f"cannot find the git directory of {path}: {result.output.text().strip()!r}",
                path=str(path),
            )
        return GitIdentity(real, st.st_dev, st.st_ino)

    async def _recorded_identity(self, project: ProjectRow) -> GitIdentity | None:
        """A project's recorded repository; one recorded before the columns existed (or whose
        repository is gone) is looked up now and filled in when found."""
        if project.kind != "git":
            return None
        if (
            project.git_dir is not None
            and project.git_dev is not None
            and project.git_ino is not None
        ):
            return GitIdentity(project.git_dir, project.git_dev, project.git_ino)
        try:
            found = await self._git_identity(project.path)
        except XumError:
            return None  # its repository is not there now; nothing to share
        with self.store.transaction():
            rows.set_project_git_identity(self.store, project.id, found.path, found.dev, found.ino)
        return found

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
            rows.set_trusted_config_hash(self.store, project.id, digest, time.time())
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
        """Remove every workspace, then the project; all or nothing as far as a check can
        tell (design 8, atomicity across objects). Every workspace is reserved (exclusive, all
        held together) and checked (state, holders, unsaved work) before any is removed: one
        refusal removes nothing and names every refusal (every holder). Then each is removed
        through the very path `workspace.remove` takes."""
        project = self.get(project_id)
        async with self.coord.project_exclusive(project.id, "remove"):
            project = self.get(project_id)
            async with AsyncExitStack() as held:
                checked = await self._reserve_and_check(held, project, force)
                # Owed teardowns of workspaces archived or removed before: this removal would
                # end with cleanup_pending, so it refuses before it removes anything.
                self._refuse_owed_teardowns(project, [])
                outcomes = await self._remove_checked(project, checked)
            failed = [o for o in outcomes if not o.ok]
            if failed:
                first = failed[0].error or {}
                kind = ErrorKind(first.get("kind", ErrorKind.OPERATION_FAILED.value))
                # The first failure's own data (a full disk's filesystem and free space, a
                # holder...) is the project error's too: a client acts on it by kind.
                detail = {k: v for k, v in first.items() if k not in ("kind", "message")}
                raise XumError(
                    kind,
                    f"project {project.name!r} not removed: {len(failed)} of {len(outcomes)} "
                    f"workspace(s) could not be removed; first: {failed[0].name!r}: "
                    f"{first.get('message')}",
                    **{**detail, "workspaces": [o.model_dump(mode="json") for o in outcomes]},
                )
            self._refuse_owed_teardowns(project, outcomes)
            with self.store.transaction():
                rows.delete_project(self.store, project.id)
        self.app.events.publish("project.removed", project_id=project.id, name=project.name)
        log.info("project.removed", project=project.id)
        return ProjectRemoveResult(project=self.info(project), removed=True, workspaces=outcomes)

    async def _reserve_and_check(
        self, held: AsyncExitStack, project: ProjectRow, force: bool
    ) -> list[removal.Checked]:
        """Reserve every workspace of the project (held in `held`) and check each; any refusal
        (another operation in progress, a holder, unsaved work, a state in between) is raised
        naming every one, with nothing changed."""
        refused: list[tuple[str, str, XumError]] = []
        reserved: list[str] = []
        for ws in rows.list_workspaces(self.store, project.id):
            try:
                ref = await held.enter_async_context(self.coord.exclusive(ws.id, "project remove"))
            except XumError as exc:
                if exc.kind is not ErrorKind.NOT_FOUND:  # removed meanwhile: nothing to do
                    refused.append((ws.id, ws.name, exc))
            else:
                reserved.append(ref.id)
        checked: list[removal.Checked] = []
        if not refused:
            # Only once all are held: a check is valid while its reservation is.
            for workspace_id in reserved:
                row = self.workspaces.row(workspace_id)
                try:
                    checked.append(await removal.check(self.workspaces, row, force))
                except XumError as exc:
                    refused.append((row.id, row.name, exc))
        if refused:
            raise _refusal(project, refused)
        return checked

    async def _remove_checked(
        self, project: ProjectRow, checked: list[removal.Checked]
    ) -> list[WorkspaceOutcome]:
        outcomes: list[WorkspaceOutcome] = []

        def as_cut() -> ProjectRemoveResult | None:
            # Cut by a shutdown after some workspaces went: say which, and that the project
            # (and the rest) remain. A workspace whose row is gone was removed (the one being
            # removed when the cut came, if its removal had committed); none gone: nothing
            # was committed, and the answer is `shutting_down`.
            cut = {"kind": ErrorKind.SHUTTING_DOWN.value, "message": "not removed: shutdown"}
            done = {o.workspace_id for o in outcomes}
            gone = {c.row.id for c in checked if rows.get_workspace(self.store, c.row.id) is None}
            if not gone:
                return None
            rest = [
                WorkspaceOutcome(
                    workspace_id=c.row.id,
                    name=c.row.name,
                    ok=c.row.id in gone,
                    error=None if c.row.id in gone else cut,
                )
                for c in checked
                if c.row.id not in done
            ]
            return ProjectRemoveResult(
                project=self.info(project), removed=False, workspaces=[*outcomes, *rest]
            )

        answer_if_cut(as_cut, "project.remove")

        for item in checked:
            try:
                if item.live:
                    # Still quiescent? Time passed while others were removed; admission is
                    # closed, but an outside process may have entered the checkout since.
                    await self.workspaces.quiescent(item.row, "remove")
                result = await removal.remove_checked(self.workspaces, item)
            except XumError as exc:
                outcomes.append(failed_outcome(item.row.id, item.row.name, exc))
            else:
                outcomes.append(
                    WorkspaceOutcome(
                        workspace_id=item.row.id,
                        name=item.row.name,
                        ok=True,
                        result=result.model_dump(mode="json"),
                    )
                )
        return outcomes

    def _refuse_owed_teardowns(self, project: ProjectRow, outcomes: list[WorkspaceOutcome]) -> None:
        """A teardown runs only under the project's trusted config, which lives on this row:
        removing the row while one is still owed would leave it pending forever (and its hint
        would name a project that cannot be trusted any more). Keep the project until then."""
        ids_ = self.workspaces.cleanup.obligations.owed_teardowns(project.id)
        if not ids_:
            return
        raise XumError(
            ErrorKind.CLEANUP_PENDING,
            f"project {project.name!r} not removed: the teardown of {len(ids_)} removed or "
            f"archived workspace(s) is still owed ({', '.join(ids_[:10])}); it runs under this "
            "project's trusted config: retry it (xum cleanup retry), then remove the project",
            workspaces=[o.model_dump(mode="json") for o in outcomes],
            owed=ids_,
        )
