"""Resource faults: disk full (a small tmpfs) during create and archive, and git missing from
PATH. Held: a clear error, nothing half-applied (no row left mid-way, no partial checkout, no
stray branch or worktree entry), nothing lost (the work is still in the checkout, and a later
archive after space is freed saves and restores it byte for byte)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from xum_client.errors import XumClientError

from tests.reliability.lifecycle_support import (
    check_invariants,
    pending_obligations,
    rows,
    small_repo,
    wait_cleanup_idle,
    worktrees,
)
from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import git, make_repo
from tests.support.tmpfs import fill
from tests.support.tmpfs import tmpfs as small_tmpfs

pytestmark = pytest.mark.reliability


@pytest.fixture
def tmpfs(tmp_short: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_short / "small", "size=6m") as mount:
        yield mount


def _kind(exc: BaseException) -> str:
    return str(getattr(exc, "kind", ""))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_disk_full_during_create(tmp_short: Path, tmpfs: Path, daemon: DaemonProcess) -> None:
    # 9 MiB of incompressible files: the checkout cannot fit in the 6 MiB tmpfs.
    repo = make_repo(tmp_short / "repo", {"README.md": "big\n"})
    for index in range(9):
        (repo / f"blob{index}.bin").write_bytes(os.urandom(1 << 20))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "big files")
    branches_before = git(repo, "for-each-ref", "--format=%(refname)", "refs/heads")
    project = daemon.call("project.add", {"path": str(repo), "workspaces_dir": str(tmpfs)})
    project_id = project["project"]["id"]
    with pytest.raises(XumClientError) as info:
        daemon.call("workspace.create", {"project_id": project_id, "name": "w"})
    error = info.value
    assert _kind(error) == "disk_full", error
    # git names the files it could not write (it does not always say ENOSPC itself); the
    # error names the filesystem that is full.
    assert "unable to write" in str(error) or "space" in str(error).lower(), str(error)
    assert getattr(error, "data", {}).get("filesystem") == str(tmpfs), error
    # Nothing half-applied: no row, no checkout, no admin entry, no branch.
    assert [r for r in rows(daemon.root) if r["project_id"] == project_id] == []
    assert not any(tmpfs.iterdir()) or sorted(p.name for p in tmpfs.iterdir()) == ["lost+found"]
    assert worktrees(repo) == {}
    assert git(repo, "for-each-ref", "--format=%(refname)", "refs/heads") == branches_before
    assert daemon.call("daemon.status")["pid"] == daemon.pid


def test_disk_full_during_archive(tmp_short: Path, tmpfs: Path, daemon: DaemonProcess) -> None:
    # Repository and checkouts on the small filesystem: the snapshot's objects must go there.
    repo = small_repo(tmpfs / "repo", files=10)
    project_id = daemon.call(
        "project.add", {"path": str(repo), "workspaces_dir": str(tmpfs / "ws")}
    )["project"]["id"]
    ws = daemon.call("workspace.create", {"project_id": project_id, "name": "w"})["workspace"]
    checkout = Path(ws["path"])
    work = checkout / "work.bin"
    work.write_bytes(os.urandom(3 << 19))  # 1.5 MiB of unsaved, incompressible work
    (checkout / "src" / "m0" / "f0.txt").write_text("edited\n")
    digest = _sha(work)
    filler = fill(tmpfs)
    with pytest.raises(XumClientError) as info:
        daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert _kind(info.value) == "disk_full", info.value
    assert getattr(info.value, "data", {}).get("filesystem") == str(tmpfs), info.value
    # Nothing lost, nothing half-applied: still active, the work still in place.
    row = next(r for r in rows(daemon.root) if r["id"] == ws["id"])
    assert row["state"] == "active", row["state"]
    assert _sha(work) == digest
    assert (checkout / "src" / "m0" / "f0.txt").read_text() == "edited\n"
    assert [o for o in pending_obligations(daemon.root) if o["workspace_id"] == ws["id"]] == []
    # Space back: the same archive now saves everything, and unarchive brings it back.
    filler.unlink()
    archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert archived["snapshot"] is not None
    wait_cleanup_idle(daemon.root)
    restored = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})["workspace"]
    assert _sha(Path(restored["path"]) / "work.bin") == digest
    assert check_invariants(daemon.root, {project_id: repo}) == []


def test_git_missing_from_path(tmp_short: Path) -> None:
    repo = small_repo(tmp_short / "repo")
    root = tmp_short / "root"
    # First with git, to have a project and an active workspace on record.
    with_git = DaemonProcess(root, log_level="info").start()
    try:
        project_id = with_git.call("project.add", {"path": str(repo)})["project"]["id"]
        ws = with_git.call("workspace.create", {"project_id": project_id, "name": "w"})
    finally:
        with_git.close()
    bare_path = tmp_short / "nogit-bin"
    bare_path.mkdir()
    no_git = DaemonProcess(root, env={"PATH": str(bare_path)}, log_level="info").start()
    try:
        for method, params in [
            ("workspace.create", {"project_id": project_id, "name": "v"}),
            ("workspace.archive", {"workspace_id": ws["workspace"]["id"]}),
            ("project.add", {"path": str(small_repo(tmp_short / "repo2"))}),
        ]:
            with pytest.raises(XumClientError) as info:
                no_git.call(method, params)
            message = str(info.value)
            assert _kind(info.value) == "operation_failed", (method, message)
            assert "git" in message and "PATH" in message, (method, message)
        states = {r["name"]: r["state"] for r in rows(root)}
        assert states == {"w": "active"}, states
        assert no_git.call("daemon.status")["pid"] == no_git.pid
    finally:
        no_git.close()
    assert worktrees(repo).keys() == {ws["workspace"]["path"]}
