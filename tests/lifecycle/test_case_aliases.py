"""Paths that alias by case: on a filesystem that ignores case (macOS by default), `Fix` and `fix`
are one directory. Each test runs a real daemon on a real case-insensitive filesystem
(tests/support/casefold_fs.py: ext4 casefold where the kernel has it, else a FUSE one): names
that differ only in case are refused `conflict`, a project added again in another case is the
same repository, and nothing is deleted through an alias. The daemon decides by asking the
filesystem (`checkouts.pathcase`); on a case-sensitive one `Fix` and `fix` stay two.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from xumd.checkouts import pathcase
from xumd.checkouts.exclusion import DirectoryExclusion, dir_key

from tests.support.casefold_fs import case_insensitive_dir
from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import add_project, assert_git_healthy, create, rpc_error


@pytest.fixture
def ci(tmp_short: Path) -> Iterator[Path]:
    with case_insensitive_dir(tmp_short / "fs") as directory:
        yield directory


def identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def entries(directory: Path) -> set[str]:
    """What is in a workspaces directory, but for the trash xum keeps there (`.xum-trash`, on a
    filesystem other than the root's)."""
    return {name for name in os.listdir(directory) if name != ".xum-trash"}


def names(daemon: DaemonProcess) -> dict[str, str]:
    listed = daemon.call("workspace.list", {})["workspaces"]
    return {w["name"]: w["state"] for w in listed}


def test_the_filesystem_is_asked_not_the_platform(ci: Path, tmp_short: Path) -> None:
    assert pathcase.case_insensitive(ci)
    assert pathcase.case_insensitive(ci / "not" / "made")  # its nearest ancestor's rule
    sensitive = tmp_short / "plain"
    sensitive.mkdir()
    assert not pathcase.case_insensitive(sensitive)
    assert not [p for p in os.listdir(ci) if p.startswith(pathcase.PROBE_PREFIX)]
    (ci / "Src" / "Repo").mkdir(parents=True)
    assert pathcase.canonical(ci / "src" / "REPO" / "new") == ci / "Src" / "Repo" / "new"
    (sensitive / "Src").mkdir()
    assert pathcase.canonical(sensitive / "src") == sensitive / "src"


def test_the_exclusion_treats_fix_and_Fix_as_one_directory(ci: Path, tmp_short: Path) -> None:
    # Not made yet: the names are compared ignoring case on this filesystem only.
    assert dir_key(ci / "Fix").conflicts(dir_key(ci / "fix"))
    plain = tmp_short / "plain"
    plain.mkdir()
    assert not dir_key(plain / "Fix").conflicts(dir_key(plain / "fix"))
    (ci / "Fix").mkdir()
    assert dir_key(ci / "fIX").conflicts(dir_key(ci / "Fix"))
    assert dir_key(ci / "fIX").realpath == str(ci / "Fix")

    async def second_waits() -> None:
        exclusion = DirectoryExclusion(wait_s=5)
        async with exclusion.directory(ci / "Fix"):
            with pytest.raises(Exception, match="timed out"):
                async with exclusion.directory(ci / "FIX", timeout=0.2):
                    pass

    anyio.run(second_waits)


def test_a_name_in_another_case_is_a_conflict(ci: Path, daemon: DaemonProcess) -> None:
    repo = make_repo(ci / "repo")
    project = add_project(daemon, repo, workspaces_dir=str(ci / "ws"))
    made = create(daemon, project["id"], "Fix")["workspace"]
    (Path(made["path"]) / "mine.txt").write_text("keep\n")
    refused = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "fix"})
    assert refused.kind == "conflict"
    assert refused.data["id"] == made["id"]
    assert names(daemon) == {"Fix": "active"}
    assert (ci / "ws" / "Fix" / "mine.txt").read_text() == "keep\n"
    assert os.listdir(ci / "ws") == ["Fix"]
    assert not any(b.strip("* ") == "xum/fix" for b in git(repo, "branch").splitlines())
    # Archived, its path is still its own: no other-case name takes it meanwhile.
    daemon.call("workspace.archive", {"workspace_id": made["id"]})
    refused = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "FIX"})
    assert refused.kind == "conflict"
    daemon.call("workspace.unarchive", {"workspace_id": made["id"]})
    assert (ci / "ws" / "fix" / "mine.txt").read_text() == "keep\n"


def test_another_project_sharing_the_directory_in_another_case(
    ci: Path, daemon: DaemonProcess
) -> None:
    one = add_project(daemon, make_repo(ci / "one"), workspaces_dir=str(ci / "WS"))
    made = create(daemon, one["id"], "fix")["workspace"]
    two = add_project(daemon, make_repo(ci / "two"), workspaces_dir=str(ci / "ws"))
    # One directory: the second project records it as stored, as the first did.
    assert two["workspaces_dir"] == one["workspaces_dir"] == str(ci / "WS")
    refused = rpc_error(daemon, "workspace.create", {"project_id": two["id"], "name": "Fix"})
    assert refused.kind == "conflict"
    other = create(daemon, two["id"], "other")["workspace"]
    # Removing the other project's workspaces (and the project) takes nothing of the first's.
    daemon.call("project.remove", {"project_id": two["id"], "force": True})
    assert not Path(other["path"]).exists()
    assert identity(Path(made["path"])) == identity(ci / "ws" / "FIX")
    assert names(daemon) == {"fix": "active"}
    assert_git_healthy(ci / "one")


def test_a_project_added_in_another_case_is_the_same_repository(
    ci: Path, daemon: DaemonProcess
) -> None:
    repo = make_repo(ci / "Src" / "Repo")
    project = add_project(daemon, repo)
    assert project["path"] == str(repo)
    for spelling in (ci / "src" / "repo", ci / "SRC" / "REPO"):
        refused = rpc_error(daemon, "project.add", {"path": str(spelling), "name": "again"})
        assert refused.kind == "conflict"
        assert refused.data["id"] == project["id"]
    assert [p["id"] for p in daemon.call("project.list", {})["projects"]] == [project["id"]]


def test_rename_to_another_workspaces_name_in_another_case(ci: Path, daemon: DaemonProcess) -> None:
    repo = make_repo(ci / "repo")
    project = add_project(daemon, repo, workspaces_dir=str(ci / "ws"))
    fix = create(daemon, project["id"], "fix")["workspace"]
    other = create(daemon, project["id"], "other")["workspace"]
    (Path(fix["path"]) / "f.txt").write_text("fix's\n")
    (Path(other["path"]) / "o.txt").write_text("other's\n")
    refused = rpc_error(daemon, "workspace.rename", {"workspace_id": other["id"], "name": "FIX"})
    assert refused.kind == "conflict"
    assert refused.data["id"] == fix["id"]
    assert names(daemon) == {"fix": "active", "other": "active"}
    assert (ci / "ws" / "fix" / "f.txt").read_text() == "fix's\n"
    assert (ci / "ws" / "other" / "o.txt").read_text() == "other's\n"
    # A name no other workspace has in any case is a rename as before.
    daemon.call("workspace.rename", {"workspace_id": other["id"], "name": "Fixed"})
    assert (ci / "ws" / "fixed" / "o.txt").read_text() == "other's\n"


def test_archive_and_remove_through_an_alias_delete_nothing_else(
    ci: Path, daemon: DaemonProcess
) -> None:
    repo = make_repo(ci / "repo")
    project = add_project(daemon, repo, workspaces_dir=str(ci / "ws"))
    fix = create(daemon, project["id"], "Fix")["workspace"]
    other = create(daemon, project["id"], "other")["workspace"]
    (Path(other["path"]) / "o.txt").write_text("other's\n")
    # Outside xum, the directory's case changes: the recorded path is now an alias of it.
    os.rename(ci / "ws" / "Fix", ci / "ws" / "FIX")
    assert entries(ci / "ws") == {"FIX", "other"}
    (ci / "ws" / "FIX" / "work.txt").write_text("unsaved\n")
    archived: dict[str, Any] = daemon.call("workspace.archive", {"workspace_id": fix["id"]})
    assert archived["workspace"]["state"] == "archived"
    assert entries(ci / "ws") == {"other"}
    assert (ci / "ws" / "other" / "o.txt").read_text() == "other's\n"
    daemon.call("workspace.unarchive", {"workspace_id": fix["id"]})
    assert (ci / "ws" / "fix" / "work.txt").read_text() == "unsaved\n"
    daemon.call("workspace.remove", {"workspace_id": fix["id"], "force": True})
    assert entries(ci / "ws") == {"other"}
    assert (ci / "ws" / "other" / "o.txt").read_text() == "other's\n"
    assert names(daemon) == {"other": "active"}
    assert_git_healthy(repo)
