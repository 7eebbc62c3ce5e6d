"""Paths the daemon owns are never user paths: `project.add` of the root, of a path inside it or
of a git directory, and a `workspaces_dir` that is (or is inside) the root, a repository, a git
directory or another project's workspaces directory, or that would put a workspace on the root
(`trash`, `archive`, `workspaces`, or the root itself) are `invalid_path` naming the overlap.
A project recorded before the rule (its `workspaces_dir` the root) cannot create or rename a
workspace onto the daemon's own directories either."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import rpc_error, worktrees


def _projects(daemon: DaemonProcess) -> list[str]:
    return sorted(p["path"] for p in daemon.call("project.list")["projects"])


def _refused(daemon: DaemonProcess, params: dict[str, Any], overlaps: Path) -> str:
    before = _projects(daemon)
    error = rpc_error(daemon, "project.add", params)
    assert error.kind == "invalid_path", error
    assert error.data["overlaps"] == str(overlaps), error.data
    assert str(overlaps) in str(error)
    assert _projects(daemon) == before  # nothing added
    return str(error)


def test_project_path_the_daemon_owns(tmp_short: Path, daemon: DaemonProcess) -> None:
    root = daemon.root.resolve()
    repo = make_repo(tmp_short / "repo")
    project = daemon.call("project.add", {"path": str(repo)})["project"]
    made = daemon.call(
        "workspace.create", {"project_id": project["id"], "name": "d", "runtime": "directory"}
    )["workspace"]
    (tmp_short / "link").symlink_to(root / "workspaces")
    for path in [root, root / "workspaces", Path(made["path"]), tmp_short / "link"]:
        _refused(daemon, {"path": str(path), "name": "x"}, root)
    # REPO/.git (and anything in it) is git's own directory, not a plain-directory project.
    for path in [repo / ".git", repo / ".git" / "refs"]:
        error = rpc_error(daemon, "project.add", {"path": str(path), "name": "x"})
        assert error.kind == "invalid_path" and "git directory" in str(error), error
    assert _projects(daemon) == [str(repo.resolve())]


def test_project_inside_another_projects_workspaces_dir(
    tmp_short: Path, daemon: DaemonProcess
) -> None:
    repo = make_repo(tmp_short / "repo")
    wsdir = tmp_short / "wsdir"
    project = daemon.call("project.add", {"path": str(repo), "workspaces_dir": str(wsdir)})
    made = daemon.call(
        "workspace.create",
        {"project_id": project["project"]["id"], "name": "d", "runtime": "directory"},
    )["workspace"]
    wsdir.mkdir(exist_ok=True)
    for path in [wsdir, Path(made["path"])]:
        _refused(daemon, {"path": str(path), "name": "x"}, wsdir.resolve())


def test_workspaces_dir_the_daemon_owns(tmp_short: Path, daemon: DaemonProcess) -> None:
    root = daemon.root.resolve()
    repo = make_repo(tmp_short / "repo")
    other = make_repo(tmp_short / "other")
    daemon.call("project.add", {"path": str(other)})
    other_ws = root / "workspaces" / "other"
    (tmp_short / "rootlink").symlink_to(root)
    cases: list[tuple[Path, Path]] = [
        (root, root),
        (tmp_short / "rootlink", root),  # a symlink spelling of the root
        (root / "trash", root),
        (root / "archive" / "x", root),
        (root / "workspaces", root),
        (repo, repo.resolve()),
        (repo / "sub", repo.resolve()),
        (repo / ".git" / "ws", (repo / ".git").resolve()),
        (other, other.resolve()),
        (other / ".git", (other / ".git").resolve()),
        (other_ws / "deeper", other_ws),
        # A workspace named after the root's own directory would be the root.
        (root.parent, root),
    ]
    for wsdir, overlaps in cases:
        message = _refused(daemon, {"path": str(repo), "workspaces_dir": str(wsdir)}, overlaps)
        assert "workspaces_dir" in message
    # What stays allowed: next to the repository (siblings), or a folder of its own under the
    # daemon's workspaces directory.
    ok = daemon.call(
        "project.add", {"path": str(repo), "workspaces_dir": str(tmp_short / "siblings")}
    )
    assert ok["project"]["workspaces_dir"] == str((tmp_short / "siblings").resolve())
    third = make_repo(tmp_short / "third")
    ok = daemon.call(
        "project.add", {"path": str(third), "workspaces_dir": str(root / "workspaces" / "t3")}
    )
    assert ok["project"]["workspaces_dir"] == str(root / "workspaces" / "t3")


def test_nested_workspaces_dirs_are_refused_shared_ones_allowed(
    tmp_short: Path, daemon: DaemonProcess
) -> None:
    # A workspace of the outer project would hold the inner project's workspaces (and its
    # archive would carry them off); two projects sharing one directory only make siblings.
    root = daemon.root.resolve()
    top = tmp_short / "top"
    shared = top / "shared"
    daemon.call(
        "project.add", {"path": str(make_repo(tmp_short / "a")), "workspaces_dir": str(shared)}
    )
    ok = daemon.call(
        "project.add", {"path": str(make_repo(tmp_short / "b")), "workspaces_dir": str(shared)}
    )
    assert ok["project"]["workspaces_dir"] == str(shared.resolve())
    message = _refused(
        daemon,
        {"path": str(make_repo(tmp_short / "c")), "workspaces_dir": str(top)},
        shared.resolve(),
    )
    assert "workspace named 'shared'" in message
    _refused(
        daemon,
        {"path": str(make_repo(tmp_short / "d")), "workspaces_dir": str(shared / "in")},
        shared.resolve(),
    )
    # The default directory of a project named like another project's explicit one is shared
    # too (allowed); one inside it is not.
    daemon.call(
        "project.add",
        {"path": str(make_repo(tmp_short / "e")), "workspaces_dir": str(root / "workspaces/foo")},
    )
    daemon.call("project.add", {"path": str(make_repo(tmp_short / "f")), "name": "foo"})
    _refused(
        daemon,
        {
            "path": str(make_repo(tmp_short / "g")),
            "workspaces_dir": str(root / "workspaces/foo/x"),
        },
        root / "workspaces/foo",
    )


@pytest.fixture
def legacy(tmp_short: Path, root: Path) -> tuple[DaemonProcess, dict[str, Any], Path]:
    """A project recorded before the rule, with the daemon's root as its workspaces_dir."""
    repo = make_repo(tmp_short / "repo")
    first = DaemonProcess(root).start()
    try:
        project = first.call(
            "project.add", {"path": str(repo), "workspaces_dir": str(tmp_short / "ws")}
        )["project"]
    finally:
        first.close()
    db = sqlite3.connect(root / "state.db")
    with db:
        db.execute(
            "UPDATE projects SET workspaces_dir = ? WHERE id = ?",
            (str(root.resolve()), project["id"]),
        )
    db.close()
    return DaemonProcess(root).start(), project, repo


def test_legacy_workspaces_dir_cannot_land_on_the_root(
    legacy: tuple[DaemonProcess, dict[str, Any], Path],
) -> None:
    daemon, project, repo = legacy
    root = daemon.root.resolve()
    try:
        branches = git(repo, "for-each-ref", "--format=%(refname)")
        for name in ["trash", "archive", "workspaces"]:
            for runtime in ["worktree", "directory"]:
                error = rpc_error(
                    daemon,
                    "workspace.create",
                    {"project_id": project["id"], "name": name, "runtime": runtime},
                )
                assert error.kind == "invalid_path", error
                assert error.data["overlaps"] == str(root / name), error.data
        assert daemon.call("workspace.list", {})["workspaces"] == []
        assert git(repo, "for-each-ref", "--format=%(refname)") == branches
        assert len(worktrees(repo)) == 1
        # A workspace with an ordinary name (still under the root, but not on its own
        # directories) is refused too: the root holds nothing but the daemon's own things.
        error = rpc_error(
            daemon, "workspace.create", {"project_id": project["id"], "name": "plain"}
        )
        assert error.kind == "invalid_path", error
    finally:
        daemon.close()


def test_rename_onto_an_owned_path_is_refused(tmp_short: Path, daemon: DaemonProcess) -> None:
    root = daemon.root.resolve()
    repo = make_repo(tmp_short / "repo")
    project = daemon.call("project.add", {"path": str(repo)})["project"]
    # Another project, whose default workspaces dir is ROOT/workspaces/two; this project's is
    # ROOT/workspaces, as recorded before the rule (project.add refuses it now).
    daemon.call("project.add", {"path": str(make_repo(tmp_short / "two"))})
    ws = daemon.call("workspace.create", {"project_id": project["id"], "name": "a"})["workspace"]
    db = sqlite3.connect(daemon.root / "state.db")
    with db:
        db.execute(
            "UPDATE projects SET workspaces_dir = ? WHERE id = ?",
            (str(root / "workspaces"), project["id"]),
        )
    db.close()
    error = rpc_error(daemon, "workspace.rename", {"workspace_id": ws["id"], "name": "two"})
    assert error.kind == "invalid_path", error
    assert error.data["overlaps"] == str(root / "workspaces" / "two"), error.data
    got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert got["name"] == "a" and Path(got["path"]).is_dir()


def test_workspaces_dir_turned_into_a_symlink_to_the_root(
    tmp_short: Path, daemon: DaemonProcess
) -> None:
    # Accepted when added; later the directory is replaced by a symlink into the root. The
    # planned path is compared as a realpath, so a workspace still cannot land on ROOT/trash.
    root = daemon.root.resolve()
    repo = make_repo(tmp_short / "repo")
    wsdir = tmp_short / "ws"
    project = daemon.call("project.add", {"path": str(repo), "workspaces_dir": str(wsdir)})
    wsdir.symlink_to(root)
    for name in ["trash", "archive"]:
        error = rpc_error(
            daemon, "workspace.create", {"project_id": project["project"]["id"], "name": name}
        )
        assert error.kind == "invalid_path", error
        assert error.data["overlaps"] == str(root / name), error.data
    assert daemon.call("workspace.list", {})["workspaces"] == []
    assert not (root / "trash").exists() or not any((root / "trash").iterdir())
