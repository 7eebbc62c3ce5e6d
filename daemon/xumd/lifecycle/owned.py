"""Paths the daemon owns are never accepted as user paths (docs/RELIABILITY.md, "paths the daemon
owns").

Owned: the root and everything in it (state database, lock, socket, config, trash, archive
store, the workspaces directory itself), every project's repository and git directory, and
every project's workspaces directory. A path given to `project.add` (the project or its
`workspaces_dir`), and the path a workspace would take (create, rename), must not overlap
any of them; the refusal is `invalid_path` naming the overlap.

All paths here are realpaths with each existing component spelled as its directory stores it
(`checkouts.pathcase.canonical`), so a symlink, `..` or other-case spelling (on a filesystem that
ignores case) of an owned path is caught too.
A workspace's path is checked again when it is planned, because a project recorded before this
rule existed may still carry a `workspaces_dir` that overlaps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from xum_protocol.errors import ErrorKind
from xum_protocol.names import name_problem

from xumd.base.errors import XumError
from xumd.base.paths import RootPaths
from xumd.checkouts import pathcase
from xumd.lifecycle import views
from xumd.lifecycle.rows import ProjectRow


@dataclass(frozen=True, slots=True)
class Owned:
    path: Path
    what: str


def real(path: Path | str) -> Path:
    return pathcase.canonical(path)


def within(path: Path, base: Path) -> bool:
    """`path` is `base` or inside it."""
    return path == base or base in path.parents


def _root_entries(paths: RootPaths) -> list[Owned]:
    root = real(paths.root)
    db = root / paths.database.name
    return [
        Owned(root / paths.lock.name, "the daemon's lock file"),
        Owned(root / paths.socket.name, "the daemon's socket"),
        Owned(db, "the daemon's state database"),
        Owned(db.with_name(db.name + "-wal"), "the daemon's state database"),
        Owned(db.with_name(db.name + "-shm"), "the daemon's state database"),
        Owned(root / paths.config.name, "the daemon's config file"),
        Owned(root / paths.trash.name, "the daemon's trash"),
        Owned(root / paths.archive_store.name, "the daemon's archive store"),
        Owned(root / paths.workspaces.name, "the daemon's workspaces directory"),
    ]


def _project_paths(
    paths: RootPaths, projects: Iterable[ProjectRow], *, skip: str | None = None
) -> tuple[list[Owned], list[Owned]]:
    """(repositories and git directories, workspaces directories) of the projects."""
    repos: list[Owned] = []
    dirs: list[Owned] = []
    for project in projects:
        label = f"project {project.name!r} ({project.id})"
        repos.append(Owned(real(project.path), f"the repository of {label}"))
        if project.git_dir:
            repos.append(Owned(real(project.git_dir), f"the git directory of {label}"))
        if project.id != skip:
            dirs.append(
                Owned(
                    real(views.workspaces_dir(paths.workspaces, project)),
                    f"the workspaces directory of {label}",
                )
            )
    return repos, dirs


def _specific_first(owned: list[Owned]) -> list[Owned]:
    """Deepest paths first, so an overlap names the most specific owner (a git directory
    before the repository around it)."""
    return sorted(owned, key=lambda o: len(o.path.parts), reverse=True)


def _refuse(subject: str, path: Path, relation: str, owned: Owned) -> XumError:
    return XumError(
        ErrorKind.INVALID_PATH,
        f"{subject} {path} {relation} {owned.what} ({owned.path}); "
        "paths the daemon owns are never user paths",
        path=str(path),
        overlaps=str(owned.path),
        owner=owned.what,
    )


def _nameable_under(base: Path, inner: Path) -> str | None:
    """The workspace name under `base` whose path would be `inner` or contain it."""
    if inner == base or base not in inner.parents:
        return None
    first = inner.relative_to(base).parts[0]
    return first if name_problem(first) is None else None


def check_project_path(path: Path, paths: RootPaths, projects: Iterable[ProjectRow]) -> None:
    """A project is never the root or inside it, nor inside a workspaces directory (a
    checkout the daemon made is not a project). Git directories are refused by the caller,
    which asks git."""
    root = real(paths.root)
    if within(path, root):
        raise _refuse("project path", path, "is inside", Owned(root, "the daemon's root"))
    _, dirs = _project_paths(paths, projects)
    for owned in dirs:
        if within(path, owned.path):
            raise _refuse("project path", path, "is inside", owned)


def check_workspaces_dir(
    path: Path,
    repo: Path,
    git_dir: Path | None,
    paths: RootPaths,
    projects: Iterable[ProjectRow],
) -> None:
    """A workspaces directory is somewhere a workspace of any valid name can be made without
    landing on anything the daemon owns: not the root (only strictly inside its workspaces
    directory), not a repository or a git directory or inside one, not inside another
    project's workspaces directory, and not a directory where a workspace name would be the
    root, a part of it or another project's workspaces directory (`trash` under the root, say).
    Two projects may share one workspaces directory: their workspaces are siblings, and a
    path one of them takes is refused to the other (it exists, and creation holds the
    directory exclusion). Nested ones are refused: a workspace of the outer project would hold
    the inner project's workspaces, and its archive would carry them off."""
    root = real(paths.root)
    own_repo = [Owned(repo, "the project's own repository")]
    if git_dir is not None:
        own_repo.append(Owned(git_dir, "the project's own git directory"))
    repos, dirs = _project_paths(paths, projects)
    dirs = [owned for owned in dirs if owned.path != path]  # shared: allowed
    ws_root = root / paths.workspaces.name
    if within(path, root) and not (path != ws_root and within(path, ws_root)):
        raise _refuse("workspaces_dir", path, "is or is inside", Owned(root, "the daemon's root"))
    for owned in _specific_first([*own_repo, *repos, *dirs]):
        if within(path, owned.path):
            raise _refuse("workspaces_dir", path, "is or is inside", owned)
    for owned in [Owned(root, "the daemon's root"), *_root_entries(paths), *dirs]:
        name = _nameable_under(path, owned.path)
        if name is not None:
            raise _refuse("workspaces_dir", path, f"would put a workspace named {name!r} on", owned)


def check_workspace_path(
    path: Path, project: ProjectRow, paths: RootPaths, projects: Iterable[ProjectRow]
) -> None:
    """The path a workspace would take (create, rename) overlaps nothing the daemon owns."""
    own_dir = real(path.parent)
    path = own_dir / path.name
    root = real(paths.root)
    repos, dirs = _project_paths(paths, projects, skip=project.id)
    dirs = [owned for owned in dirs if owned.path != own_dir]  # a shared workspaces directory
    ws_root = root / paths.workspaces.name
    for owned in _specific_first([*_root_entries(paths), *repos, *dirs]):
        inside = within(path, owned.path) and owned.path != ws_root
        if inside or within(owned.path, path):
            raise _refuse("workspace path", path, "overlaps", owned)
    if within(path, root) and not (path != ws_root and within(path, ws_root)):
        raise _refuse("workspace path", path, "is inside", Owned(root, "the daemon's root"))
    if within(root, path):
        raise _refuse("workspace path", path, "would contain", Owned(root, "the daemon's root"))
