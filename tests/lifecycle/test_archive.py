"""Archive, unarchive and remove: snapshots, dropped ignored files, git's own view."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import (
    assert_git_healthy,
    branch_exists,
    create,
    rpc_error,
    worktrees,
)

FILES = {
    "README.md": "hello\n",
    ".gitignore": "ignored/\n.env*\n",
    "src/keep.txt": "keep\n",
    "src/both.txt": "v1\n",
    "gone.txt": "will be deleted\n",
    "staged-gone.txt": "will be git rm'd\n",
}


@pytest.fixture
def repo(tmp_short: Path) -> Path:
    return make_repo(tmp_short / "repo", FILES)


def dirty_up(path: Path) -> None:
    """Every kind of uncommitted work, plus ignored files."""
    (path / "README.md").write_text("hello, unstaged\n")
    (path / "staged.txt").write_text("staged new file\n")
    git(path, "add", "staged.txt")
    (path / "src" / "both.txt").write_text("v2 staged\n")
    git(path, "add", "src/both.txt")
    (path / "src" / "both.txt").write_text("v3 unstaged\n")
    (path / "untracked.txt").write_bytes(b"\x00\x01binary untracked\xff")
    (path / "deep" / "er").mkdir(parents=True)
    (path / "deep" / "er" / "new.txt").write_text("untracked in a subdir\n")
    (path / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (path / "run.sh").chmod(0o755)
    (path / "gone.txt").unlink()
    git(path, "rm", "-q", "staged-gone.txt")
    (path / "ignored").mkdir()
    (path / "ignored" / "big.bin").write_bytes(b"x" * 5000)
    (path / ".env").write_text("SECRET=1\n")


def state_of(path: Path) -> dict[str, Any]:
    files: dict[str, tuple[str, int]] = {}
    for dirpath, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in names:
            full = Path(dirpath) / name
            if name == ".git":
                continue
            rel = str(full.relative_to(path))
            files[rel] = (hashlib.sha256(full.read_bytes()).hexdigest(), full.stat().st_mode)
    return {
        "status": git(path, "status", "--porcelain=v1", "--untracked-files=all"),
        "cached": git(path, "diff", "--cached"),
        "unstaged": git(path, "diff"),
        "files": files,
    }


def test_archive_unarchive_round_trip(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "rt")["workspace"]
    path = Path(ws["path"])
    dirty_up(path)
    before = state_of(path)

    result = daemon.call("workspace.archive", {"workspace_id": ws["id"]})

    assert result["workspace"]["state"] == "archived"
    snap = result["snapshot"]
    assert snap["ref"] == f"refs/xum/snapshots/{ws['id']}/{ws['incarnation']}"
    assert git(repo, "rev-parse", snap["ref"]).strip() == snap["commit"]
    shown = subprocess.run(
        ["git", "-C", str(repo), "show", f"{snap['commit']}:untracked.txt"],
        capture_output=True,
        check=True,
    ).stdout
    assert shown == b"\x00\x01binary untracked\xff"
    assert git(repo, "show", f"{snap['commit']}:src/both.txt") == "v3 unstaged\n"
    assert git(repo, "show", f"{snap['commit']}^2:src/both.txt") == "v2 staged\n"
    assert set(snap["files"]) >= {
        "README.md",
        "staged.txt",
        "src/both.txt",
        "untracked.txt",
        "deep/er/new.txt",
        "run.sh",
        "gone.txt",
        "staged-gone.txt",
    }
    assert "ignored/big.bin" not in snap["files"]
    dropped = result["dropped"]
    assert dropped["count"] == 2 and dropped["bytes"] == 5000 + len("SECRET=1\n")
    assert set(dropped["paths"]) == {"ignored/", ".env"}
    assert result["cleanup"]["status"] == "completed"
    assert not path.exists()
    assert str(path) not in worktrees(repo)
    assert branch_exists(repo, "xum/rt")
    assert_git_healthy(repo)

    again = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    restored = again["workspace"]
    assert restored["state"] == "active"
    assert restored["incarnation"] != ws["incarnation"]
    assert worktrees(repo)[str(path)]["locked"] == f"xum {ws['id']} {restored['incarnation']}"
    after = state_of(path)
    expected_files = {
        k: v for k, v in before["files"].items() if not k.startswith(("ignored/", ".env"))
    }
    assert after["files"] == expected_files
    assert after["status"] == before["status"]
    assert after["cached"] == before["cached"]
    assert after["unstaged"] == before["unstaged"]
    assert not (path / "ignored").exists()
    assert_git_healthy(repo)


def test_archive_does_not_touch_index_or_stash(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "idx")["workspace"]
    path = Path(ws["path"])
    dirty_up(path)
    admin = Path(git(path, "rev-parse", "--absolute-git-dir").strip())
    index_before = (admin / "index").read_bytes()
    status_before = git(path, "status", "--porcelain=v1", "--untracked-files=all")
    # Snapshot only: a holder would make archive refuse; here we read the snapshot step's
    # effect through remove's not_safe check, which captures without writing.
    err = rpc_error(daemon, "workspace.remove", {"workspace_id": ws["id"]})
    assert err.kind == "not_safe"
    assert (admin / "index").read_bytes() == index_before
    assert git(path, "status", "--porcelain=v1", "--untracked-files=all") == status_before
    assert git(repo, "stash", "list") == ""
    assert "untracked.txt" in err.data["files"]
    assert "README.md" in err.message


def test_clean_archive_has_no_snapshot(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "clean")["workspace"]
    result = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert result["snapshot"] is None
    assert result["dropped"] == {
        "count": 0,
        "bytes": 0,
        "paths": [],
        "preserved": [],
        "special": [],
    }
    assert result["cleanup"]["status"] == "completed"
    assert git(repo, "for-each-ref", "refs/xum/") == ""
    back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert back["restored"]["snapshot"] is None
    assert git(Path(ws["path"]), "status", "--porcelain") == ""


def test_preserve_keeps_chosen_ignored_files(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    (repo / ".xum").mkdir()
    (repo / ".xum" / "config.toml").write_text('[scripts]\npreserve = [".env*"]\n')
    git(repo, "add", ".xum")
    git(repo, "commit", "-q", "-m", "config")
    ws = create(daemon, project["id"], "pres")["workspace"]
    path = Path(ws["path"])
    (path / ".env").write_text("SECRET=1\n")
    (path / ".env.local").write_text("LOCAL=2\n")
    (path / "ignored").mkdir()
    (path / "ignored" / "junk").write_text("junk")
    result = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert sorted(result["dropped"]["preserved"]) == [".env", ".env.local"]
    assert result["dropped"]["count"] == 1
    assert (daemon.root / "archive" / ws["id"] / "files" / ".env").read_text() == "SECRET=1\n"
    back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert sorted(back["restored"]["preserved"]) == [".env", ".env.local"]
    assert (path / ".env").read_text() == "SECRET=1\n"
    assert (path / ".env.local").read_text() == "LOCAL=2\n"
    assert not (path / "ignored").exists()


def test_archive_and_unarchive_errors(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "st")["workspace"]
    err = rpc_error(daemon, "workspace.unarchive", {"workspace_id": ws["id"]})
    assert err.kind == "invalid_state"
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    err = rpc_error(daemon, "workspace.archive", {"workspace_id": ws["id"]})
    assert err.kind == "invalid_state"
    missing = {"workspace_id": "ws_0123456789abcdef"}
    for method in ("workspace.archive", "workspace.unarchive", "workspace.remove"):
        assert rpc_error(daemon, method, missing).kind == "not_found"
        assert rpc_error(daemon, method, {"workspace_id": project["id"]}).kind == ("invalid_scope")


def test_unarchive_refuses_an_occupied_path(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "occ")["workspace"]
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    Path(ws["path"]).mkdir()
    (Path(ws["path"]) / "mine").write_text("someone else's")
    err = rpc_error(daemon, "workspace.unarchive", {"workspace_id": ws["id"]})
    assert err.kind in ("conflict", "cleanup_pending")
    assert (Path(ws["path"]) / "mine").read_text() == "someone else's"
    assert daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]["state"] == (
        "archived"
    )


# -- remove --------------------------------------------------------------------------------------


def test_remove_clean_workspace(daemon: DaemonProcess, repo: Path, project: dict[str, Any]) -> None:
    ws = create(daemon, project["id"], "rm")["workspace"]
    result = daemon.call("workspace.remove", {"workspace_id": ws["id"]})
    assert result["removed"] is True
    assert result["snapshot"] is None
    assert result["cleanup"]["status"] == "completed"
    assert not Path(ws["path"]).exists()
    assert branch_exists(repo, "xum/rm")
    assert str(Path(ws["path"])) not in worktrees(repo)
    assert_git_healthy(repo)
    for method in ("workspace.get", "workspace.remove", "workspace.archive"):
        assert rpc_error(daemon, method, {"workspace_id": ws["id"]}).kind == "not_found"


def test_remove_dirty_is_not_safe_then_force_snapshots(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "dirty")["workspace"]
    path = Path(ws["path"])
    (path / "work.txt").write_text("precious\n")
    err = rpc_error(daemon, "workspace.remove", {"workspace_id": ws["id"]})
    assert err.kind == "not_safe"
    assert err.data["files"] == ["work.txt"]
    assert (path / "work.txt").exists()
    result = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    assert result["removed"] is True
    snap = result["snapshot"]
    assert snap["files"] == ["work.txt"]
    assert git(repo, "show", f"{snap['ref']}:work.txt") == "precious\n"
    assert not path.exists()
    assert branch_exists(repo, "xum/dirty")
    assert_git_healthy(repo)


def test_remove_archived_workspace_keeps_refs(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "arc")["workspace"]
    (Path(ws["path"]) / "w.txt").write_text("w\n")
    snap = daemon.call("workspace.archive", {"workspace_id": ws["id"]})["snapshot"]
    result = daemon.call("workspace.remove", {"workspace_id": ws["id"]})
    assert result["removed"] is True
    assert git(repo, "rev-parse", snap["ref"]).strip() == snap["commit"]
    assert branch_exists(repo, "xum/arc")
    assert daemon.call("workspace.list")["workspaces"] == []


def test_remove_with_work_held_by_snapshot_is_safe(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "held")["workspace"]
    path = Path(ws["path"])
    (path / "w.txt").write_text("w\n")
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert (path / "w.txt").read_text() == "w\n"
    # The restored work is exactly the snapshot's: removing loses nothing.
    result = daemon.call("workspace.remove", {"workspace_id": ws["id"]})
    assert result["removed"] is True
