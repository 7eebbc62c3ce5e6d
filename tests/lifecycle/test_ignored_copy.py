"""Ignored files of the main checkout copied into a new checkout (and at
unarchive, what the archive did not preserve). Real repositories, real files, real symlinks,
FIFOs and mounts, a real XFS image with reflinks where one can be mounted, a real tmpfs that is
too small; a real daemon."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from xumd.base.errors import XumError
from xumd.lifecycle import seed
from xumd.system import fscopy
from xumd.system.git import Git

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import add_project, branch_exists, create, rpc_error, worktrees
from tests.support.mounts import Mounts, real_mounts
from tests.support.reflinkfs import xfs_reflink
from tests.support.tmpfs import fill, tmpfs

GITIGNORE = ".env\nnode_modules/\n*.log\nbig/\ncache\nfifo-dir/\nbuild/*.o\n"


def seeded_repo(path: Path, config: str, worktreeinclude: str | None = None) -> Path:
    """A repository whose main checkout has ignored files, and an untracked one that is not."""
    files = {".gitignore": GITIGNORE, "README.md": "hi\n"}
    if config:
        files[".xum/config.toml"] = config
    if worktreeinclude is not None:
        files[".worktreeinclude"] = worktreeinclude
    make_repo(path, files)
    (path / ".env").write_text("SECRET=main\n")
    (path / "sub").mkdir()
    (path / "sub" / ".env").write_text("SUB=1\n")
    (path / "node_modules" / "pkg").mkdir(parents=True)
    (path / "node_modules" / "pkg" / "index.js").write_text("module.exports = 1\n" * 100)
    (path / "node_modules" / "pkg" / "run").write_text("#!/bin/sh\n")
    (path / "node_modules" / "pkg" / "run").chmod(0o755)
    (path / "app.log").write_text("log\n")
    (path / "notes.txt").write_text("untracked, not ignored\n")
    (path / "build").mkdir()
    (path / "build" / "a.o").write_text("object\n")
    (path / "build" / "a.c").write_text("not ignored\n")
    return path


def tree(top: Path) -> dict[str, str]:
    """Every file (content) and symlink (-> target) under `top`, .git aside."""
    found: dict[str, str] = {}
    for dirpath, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in dirs + files:
            full = Path(dirpath, name)
            rel = str(full.relative_to(top))
            if full.is_symlink():
                found[rel] = "-> " + os.readlink(full)
            elif full.is_file():
                found[rel] = full.read_text(errors="replace")
    return found


@pytest.fixture
def mounts(tmp_short: Path) -> Iterator[Mounts]:
    with real_mounts(tmp_short) as m:
        yield m


def trusted(daemon: DaemonProcess, repo: Path) -> dict[str, Any]:
    project = add_project(daemon, repo)
    daemon.call("project.trust", {"project_id": project["id"]})
    return project


CONFIG = (
    '[create]\ncopy = [".env", "node_modules/", "notes.txt", "build/"]\n'
    '[scripts]\nsetup = ["cat .env > seen-by-setup"]\n'
)


def test_matching_ignored_files_are_copied_before_setup(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    repo = seeded_repo(tmp_short / "repo", CONFIG, worktreeinclude="# logs too\n*.log\n")
    project = trusted(daemon, repo)
    made = create(daemon, project["id"], "w")
    ws = Path(made["workspace"]["path"])
    got = tree(ws)
    # Matched and ignored: copied (a pattern with no slash matches at any depth).
    assert got[".env"] == "SECRET=main\n" and got["sub/.env"] == "SUB=1\n"
    assert got["node_modules/pkg/index.js"] == (repo / "node_modules/pkg/index.js").read_text()
    assert os.stat(ws / "node_modules/pkg/run").st_mode & 0o777 == 0o755
    assert got["app.log"] == "log\n"  # from .worktreeinclude
    assert got["build/a.o"] == "object\n"
    # Matched but not ignored by the repository: never copied.
    assert "notes.txt" not in got and "build/a.c" not in got
    # Setup ran after the copy and saw it.
    assert made["setup"]["status"] == "ok", made["setup"]
    assert got["seen-by-setup"] == "SECRET=main\n"
    report = made["ignored_copy"]
    assert report["status"] == "ok"
    assert sorted(report["paths"]) == [".env", "app.log", "build/a.o", "node_modules/", "sub/.env"]
    assert report["files"] == 6
    assert report["cloned"] + report["copied"] == 6
    assert report["bytes"] > 0 and report["elapsed_s"] >= 0
    # The main checkout is untouched.
    assert (repo / ".env").read_text() == "SECRET=main\n"


def test_nothing_configured_copies_nothing(daemon: DaemonProcess, tmp_short: Path) -> None:
    repo = seeded_repo(tmp_short / "repo", "")
    project = add_project(daemon, repo)
    made = create(daemon, project["id"], "w")
    assert made["ignored_copy"]["status"] == "none"
    assert ".env" not in tree(Path(made["workspace"]["path"]))


def test_symlinks_are_copied_as_links_and_never_followed(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    outside = tmp_short / "outside"
    outside.mkdir()
    (outside / "secret").write_text("outside the repository\n")
    repo = seeded_repo(tmp_short / "repo", '[create]\ncopy = [".env", "cache", "node_modules/"]\n')
    (repo / ".env").unlink()
    (repo / ".env").symlink_to(outside / "secret")
    (repo / "cache").symlink_to(outside)
    (repo / "node_modules" / "escape").symlink_to(outside)
    project = add_project(daemon, repo)
    made = create(daemon, project["id"], "w")
    ws = Path(made["workspace"]["path"])
    assert os.readlink(ws / ".env") == str(outside / "secret")
    assert os.readlink(ws / "cache") == str(outside)
    assert os.readlink(ws / "node_modules" / "escape") == str(outside)
    assert (ws / "node_modules" / "escape").is_symlink()
    # Nothing of the outside directory was copied as files.
    assert [p for p in ws.rglob("secret") if not p.is_symlink()] == []


def test_a_symlink_on_the_way_to_an_entry_is_refused(tmp_short: Path) -> None:
    """The planner opens each component with O_NOFOLLOW: a directory swapped for a link
    between git's listing and the copy is refused, not followed."""
    src, dest, outside = tmp_short / "src", tmp_short / "dest", tmp_short / "outside"
    for d in (src, dest, outside):
        d.mkdir()
    (outside / ".env").write_text("outside\n")
    (src / "sub").symlink_to(outside)
    plan = seed._plan(src, dest, ["sub/.env"], 1 << 30, lambda _rel: False)
    assert plan.todo == [] and plan.refused == ["sub/.env (a symlink on its path: not followed)"]


def test_special_files_are_skipped_and_reported(daemon: DaemonProcess, tmp_short: Path) -> None:
    repo = seeded_repo(tmp_short / "repo", '[create]\ncopy = ["fifo-dir/"]\n')
    (repo / "fifo-dir").mkdir()
    os.mkfifo(repo / "fifo-dir" / "pipe")
    (repo / "fifo-dir" / "plain").write_text("x\n")
    project = add_project(daemon, repo)
    made = create(daemon, project["id"], "w")
    ws = Path(made["workspace"]["path"])
    assert (ws / "fifo-dir" / "plain").read_text() == "x\n"
    assert not os.path.lexists(ws / "fifo-dir" / "pipe")
    assert made["ignored_copy"]["special"] == ["fifo-dir/pipe (fifo)"]


def test_the_size_cap_stops_the_copy_with_a_report(tmp_short: Path) -> None:
    repo = seeded_repo(tmp_short / "repo", '[create]\ncopy = [".env", "big/", "node_modules/"]\n')
    (repo / "big").mkdir()
    (repo / "big" / "blob").write_bytes(os.urandom(256 * 1024))
    root = tmp_short / "root"
    write_config(root, "[create]\ncopy_max_bytes = 65536\n")
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        made = create(daemon, project["id"], "w")
        ws = Path(made["workspace"]["path"])
        report = made["ignored_copy"]
        assert report["status"] == "capped" and report["limit_bytes"] == 65536
        # In order: .env fits, big/ does not: the copy stops there (the rest is not copied).
        assert report["paths"] == [".env"]
        assert report["skipped"] == ["big/", "node_modules/", "sub/.env"]
        assert (ws / ".env").exists()
        assert not (ws / "big").exists() and not (ws / "node_modules").exists()
        assert made["workspace"]["state"] == "active"
    finally:
        daemon.close()


def test_a_copy_that_times_out_undoes_the_create(tmp_short: Path) -> None:
    repo = seeded_repo(tmp_short / "repo", '[create]\ncopy = ["node_modules/"]\n')
    root = tmp_short / "root"
    write_config(root, "[create]\ncopy_timeout_s = 0.000001\n[ports]\ncount = 1\n")
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        error = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "w"})
        assert error.kind == "timeout"
        assert "copying ignored files" in str(error)
        # No false success, no orphan: no row, no checkout, no worktree, no branch, no port.
        assert daemon.call("workspace.list")["workspaces"] == []
        assert not (root / "workspaces").exists() or not any((root / "workspaces").rglob("w"))
        assert len(worktrees(repo)) == 1
        assert not branch_exists(repo, "xum/w")
        db = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True)
        try:
            assert db.execute("SELECT count(*) FROM workspace_ports").fetchone() == (0,)
        finally:
            db.close()
    finally:
        daemon.close()


def test_a_copy_that_does_not_fit_is_refused_and_undone(tmp_short: Path) -> None:
    repo = seeded_repo(tmp_short / "repo", '[create]\ncopy = ["big/"]\n')
    (repo / "big").mkdir()
    (repo / "big" / "blob").write_bytes(os.urandom(3 << 20))
    small = tmp_short / "small"
    with tmpfs(small, "size=2m"):
        daemon = DaemonProcess(tmp_short / "root").start()
        try:
            project = add_project(daemon, repo, workspaces_dir=str(small))
            error = rpc_error(
                daemon, "workspace.create", {"project_id": project["id"], "name": "w"}
            )
            assert error.kind == "disk_full"
            assert daemon.call("workspace.list")["workspaces"] == []
            assert not (small / "w").exists()
            assert len(worktrees(repo)) == 1
        finally:
            daemon.close()


@pytest.mark.parametrize("kind", ["tmpfs", "bind"])
def test_the_copy_never_enters_another_mount(
    daemon: DaemonProcess, tmp_short: Path, mounts: Mounts, kind: str
) -> None:
    repo = seeded_repo(tmp_short / "repo", '[create]\ncopy = ["node_modules/"]\n')
    inner = repo / "node_modules" / "mnt"
    inner.mkdir()
    if kind == "tmpfs":
        mounts.tmpfs(inner)
    else:
        other = repo / "node_modules" / "elsewhere"  # same filesystem: same st_dev
        other.mkdir()
        (other / "x").write_text("x\n")
        mounts.bind(other, inner)
    (inner / "on-the-mount").write_text("not the checkout's\n")
    project = add_project(daemon, repo)
    made = create(daemon, project["id"], "w")
    ws = Path(made["workspace"]["path"])
    assert (ws / "node_modules" / "pkg" / "index.js").exists()
    assert not (ws / "node_modules" / "mnt").exists()
    assert made["ignored_copy"]["mounts"] == ["node_modules/mnt"]


def test_files_are_cloned_on_a_filesystem_with_reflinks(tmp_short: Path) -> None:
    with xfs_reflink(tmp_short) as xfs:
        repo = seeded_repo(xfs / "repo", '[create]\ncopy = ["node_modules/", ".env"]\n')
        daemon = DaemonProcess(tmp_short / "root").start()
        try:
            project = add_project(daemon, repo, workspaces_dir=str(xfs / "ws"))
            made = create(daemon, project["id"], "w")
            report = made["ignored_copy"]
            assert report["files"] == 4  # .env, sub/.env, node_modules/pkg/{index.js,run}
            assert report["cloned"] == 4 and report["copied"] == 0
            # The tracked files are git's checkout: a clone of them measured no faster.
            assert made["materialised"] == "git"
            assert git(xfs / "ws" / "w", "status", "--porcelain") == ""
            copy = xfs / "ws" / "w" / "node_modules" / "pkg" / "index.js"
            assert copy.read_text() == (repo / "node_modules/pkg/index.js").read_text()
            # Shared extents: a write to the clone leaves the source as it was.
            copy.write_text("changed\n")
            assert (repo / "node_modules/pkg/index.js").read_text().startswith("module.exports")
        finally:
            daemon.close()


def test_without_reflinks_the_data_is_copied(daemon: DaemonProcess, tmp_short: Path) -> None:
    fstype = subprocess.run(
        ["stat", "-f", "-c", "%T", str(tmp_short)], capture_output=True, text=True, check=True
    ).stdout.strip()
    if fstype in ("xfs", "btrfs", "bcachefs"):
        pytest.skip(f"{tmp_short} is on {fstype}, which may clone")
    repo = seeded_repo(tmp_short / "repo", '[create]\ncopy = ["node_modules/", ".env"]\n')
    project = add_project(daemon, repo)
    made = create(daemon, project["id"], "w")
    report = made["ignored_copy"]
    assert report["files"] == 4 and report["cloned"] == 0 and report["copied"] == 4
    assert made["materialised"] == "git"


def test_unarchive_copies_what_the_archive_did_not_preserve(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    repo = seeded_repo(
        tmp_short / "repo",
        '[create]\ncopy = [".env", "node_modules/"]\n[scripts]\npreserve = [".env"]\n',
    )
    project = add_project(daemon, repo)
    ws = create(daemon, project["id"], "w")["workspace"]
    path = Path(ws["path"])
    (path / ".env").write_text("SECRET=mine\n")
    (repo / "node_modules" / "pkg" / "new.js").write_text("added later\n")
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    # The preserved .env is the user's, not the main checkout's; node_modules is copied again.
    assert (path / ".env").read_text() == "SECRET=mine\n"
    assert (path / "node_modules" / "pkg" / "new.js").read_text() == "added later\n"
    report = back["ignored_copy"]
    assert report["paths"] == ["node_modules/"] and report["existing"] == [".env", "sub/.env"]


def test_a_worktreeinclude_that_is_a_fifo_is_refused_without_hanging(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    repo = seeded_repo(tmp_short / "repo", "")
    os.mkfifo(repo / ".worktreeinclude")  # opened for reading, it would block forever
    project = add_project(daemon, repo)
    error = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "w"})
    assert error.kind == "invalid_params"
    assert ".worktreeinclude" in str(error) and "not a regular file" in str(error)
    assert daemon.call("workspace.list")["workspaces"] == []


def test_a_symlink_on_the_way_in_the_new_checkout_is_not_written_through(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    """The branch tracks `conf` as a link out of the repository where the main checkout has a
    directory holding an ignored `.env`: the copy refuses that entry instead of writing
    through the link (outside the new checkout), and the create still succeeds."""
    outside = tmp_short / "outside"
    outside.mkdir()
    repo = seeded_repo(tmp_short / "repo", '[create]\ncopy = [".env"]\n')
    git(repo, "checkout", "-q", "-b", "linked")
    (repo / "conf").symlink_to(outside)
    git(repo, "add", "conf")
    git(repo, "commit", "-q", "-m", "conf is a link")
    git(repo, "checkout", "-q", "main")
    (repo / "conf").mkdir()
    (repo / "conf" / ".env").write_text("CONF=main\n")
    project = add_project(daemon, repo)
    made = create(daemon, project["id"], "w", branch="linked")
    ws = Path(made["workspace"]["path"])
    assert os.readlink(ws / "conf") == str(outside)
    assert list(outside.iterdir()) == []  # nothing written through the link
    report = made["ignored_copy"]
    assert (
        "conf/.env (a symlink on its path in the new checkout: not followed)" in report["special"]
    )
    assert (ws / ".env").read_text() == "SECRET=main\n" and ".env" in report["paths"]


def test_unarchive_merges_into_a_directory_a_preserved_file_restored(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    """`preserve` kept one file inside `node_modules/`; at unarchive the rest of
    `node_modules/` comes from the main checkout around it, and the preserved file stays."""
    repo = seeded_repo(
        tmp_short / "repo",
        '[create]\ncopy = ["node_modules/"]\n[scripts]\npreserve = ["node_modules/pkg/run"]\n',
    )
    project = add_project(daemon, repo)
    ws = create(daemon, project["id"], "w")["workspace"]
    path = Path(ws["path"])
    (path / "node_modules" / "pkg" / "run").write_text("#!/bin/sh\n# mine\n")
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert (path / "node_modules" / "pkg" / "run").read_text() == "#!/bin/sh\n# mine\n"
    assert (path / "node_modules" / "pkg" / "index.js").read_text() == (
        repo / "node_modules" / "pkg" / "index.js"
    ).read_text()
    assert back["ignored_copy"]["paths"] == ["node_modules/"]
    assert back["ignored_copy"]["files"] == 1  # index.js; run was the user's


def test_an_entry_deleted_from_the_main_checkout_after_sizing_is_skipped(tmp_short: Path) -> None:
    """Between the sizing and the copy the main checkout changes (an `npm ci` there): an entry
    gone meanwhile is skipped, not a failed create."""
    src, dest = tmp_short / "src", tmp_short / "dest"
    (src / "node_modules").mkdir(parents=True)
    (src / "node_modules" / "a.js").write_text("a\n")
    (src / ".env").write_text("E=1\n")
    dest.mkdir()
    plan = seed._plan(src, dest, [".env", "node_modules/"], 1 << 30, lambda _rel: False)
    assert [p.entry for p in plan.todo] == [".env", "node_modules/"]
    (src / "node_modules" / "a.js").unlink()
    (src / "node_modules").rmdir()
    seed._copy(src, dest, plan, lambda _rel: False)
    assert plan.done == [".env"] and plan.vanished == ["node_modules/"]
    assert (dest / ".env").read_text() == "E=1\n" and not (dest / "node_modules").exists()


def test_an_entry_the_new_checkout_has_already_does_not_count_against_the_cap(
    tmp_short: Path,
) -> None:
    """A file the branch tracks (or the archive restored) is left as it is: it must not use up
    the cap and push the entries after it into `skipped`."""
    src, dest = tmp_short / "src", tmp_short / "dest"
    src.mkdir()
    (src / "big.log").write_bytes(os.urandom(256 * 1024))
    (src / "z.env").write_text("E=1\n")
    dest.mkdir()
    (dest / "big.log").write_text("tracked on the branch\n")
    plan = seed._plan(src, dest, ["big.log", "z.env"], 65536, lambda _rel: False)
    assert plan.existing == ["big.log"] and plan.skipped == []
    assert [p.entry for p in plan.todo] == ["z.env"]


def test_a_disk_that_fills_up_mid_copy_is_disk_full_and_the_partial_entry_is_removed(
    tmp_short: Path,
) -> None:
    """The space check passed, then something else fills the filesystem while the copy runs:
    a real ENOSPC mid-copy is `disk_full` (not an internal error), and the entry being copied
    is removed, not left half-written (the caller then undoes the checkout)."""
    repo = make_repo(tmp_short / "repo", {".gitignore": "node_modules/\n"})
    for i in range(8):
        (repo / "node_modules" / "pkg").mkdir(parents=True, exist_ok=True)
        (repo / "node_modules" / "pkg" / f"f{i}.js").write_bytes(os.urandom(64 * 1024))
    with tmpfs(tmp_short / "small", "size=2m") as dest:
        filled: list[Path] = []

        def stopping() -> bool:
            # Called before each file; once the copy has begun, another writer fills the disk.
            if not filled and (dest / "node_modules").exists():
                filled.append(fill(dest))
            return False

        with pytest.raises(XumError) as caught:
            anyio.run(
                lambda: seed.seed(
                    Git(),
                    repo,
                    dest,
                    ["node_modules/"],
                    cap=1 << 30,
                    timeout_s=60,
                    stopping=stopping,
                )
            )
        assert filled, "the copy never started"
        assert caught.value.kind == "disk_full", caught.value
        assert not (dest / "node_modules").exists()


def _stop_once_the_copy_began(repo: Path, dest: Path, entry: str) -> None:
    """Seed `entry` from `repo` into `dest`, the daemon stopping from the moment the entry
    appears at `dest` (and from then on, as `app.stopping` is): the copy ends `shutting_down`
    (not `timeout`) and the partial entry is removed."""
    dest.mkdir()
    written = dest / entry.rstrip("/")
    began: list[bool] = []

    def stopping() -> bool:
        if written.exists():
            began.append(True)
        return bool(began)

    with pytest.raises(XumError) as caught:
        anyio.run(
            lambda: seed.seed(
                Git(), repo, dest, [entry], cap=1 << 40, timeout_s=60, stopping=stopping
            )
        )
    assert caught.value.kind == "shutting_down", caught.value
    assert began, "the copy never began"
    assert not written.exists()


def test_a_shutdown_mid_copy_stops_it_at_the_next_file_and_removes_the_partial_entry(
    tmp_short: Path,
) -> None:
    """The daemon starts stopping while a directory is being copied: the copy stops at the
    next file with `shutting_down` (not `timeout`), and the half-copied directory is removed."""
    repo = make_repo(tmp_short / "repo", {".gitignore": "node_modules/\n"})
    (repo / "node_modules").mkdir()
    for i in range(5):
        (repo / "node_modules" / f"f{i}.js").write_text(f"{i}\n")
    _stop_once_the_copy_began(repo, tmp_short / "dest", "node_modules/")


@pytest.mark.parametrize("kind", ["tmpfs", "bind"])
def test_a_matched_directory_that_is_itself_a_mount_is_reported_not_copied(
    daemon: DaemonProcess, tmp_short: Path, mounts: Mounts, kind: str
) -> None:
    """`cache/` of the main checkout is a mount point: it is neither entered nor listed among
    the entries copied (no false success), only among the mounts."""
    repo = seeded_repo(tmp_short / "repo", '[create]\ncopy = ["cache", ".env"]\n')
    inner = repo / "cache"
    inner.mkdir()
    if kind == "tmpfs":
        mounts.tmpfs(inner)
    else:
        other = tmp_short / "elsewhere"
        other.mkdir()
        mounts.bind(other, inner)
    (inner / "on-the-mount").write_text("not the checkout's\n")
    project = add_project(daemon, repo)
    made = create(daemon, project["id"], "w")
    ws = Path(made["workspace"]["path"])
    report = made["ignored_copy"]
    assert not (ws / "cache").exists()
    assert report["paths"] == [".env", "sub/.env"], report
    assert report["mounts"] == ["cache"], report


def test_an_unarchive_whose_copy_fails_stays_archived_and_loses_nothing(tmp_short: Path) -> None:
    """The copy at unarchive times out: the unarchive is undone (no false success), the
    workspace is archived as before, and a later unarchive brings back the user's work."""
    repo = seeded_repo(
        tmp_short / "repo",
        '[create]\ncopy = [".env", "node_modules/"]\n[scripts]\npreserve = [".env"]\n',
    )
    root = tmp_short / "root"
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "w")["workspace"]
        path = Path(ws["path"])
        (path / ".env").write_text("SECRET=mine\n")
        (path / "work.txt").write_text("untracked work\n")
        daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    finally:
        daemon.close()
    write_config(root, "[create]\ncopy_timeout_s = 0.000001\n")
    daemon = DaemonProcess(root).start()
    try:
        error = rpc_error(daemon, "workspace.unarchive", {"workspace_id": ws["id"]})
        assert error.kind == "timeout" and "copying ignored files" in str(error)
        row = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
        assert row["state"] == "archived" and not row.get("interrupted")
        assert not path.exists()
    finally:
        daemon.close()
    write_config(root, "")
    daemon = DaemonProcess(root).start()
    try:
        back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
        assert back["workspace"]["state"] == "active"
        assert (path / ".env").read_text() == "SECRET=mine\n"
        assert (path / "work.txt").read_text() == "untracked work\n"
        assert (path / "node_modules" / "pkg" / "index.js").exists()
    finally:
        daemon.close()


def test_a_shutdown_during_one_large_file_stops_between_its_chunks(tmp_short: Path) -> None:
    """One file much larger than a copy chunk: a stop is honoured between its chunks, not
    only before the next file (a multi-gigabyte file on a slow disk would hold the shutdown
    and overrun `copy_timeout_s`); the half-written file is removed."""
    repo = make_repo(tmp_short / "repo", {".gitignore": "*.bin\n"})
    with (repo / "big.bin").open("wb") as out:
        for _ in range(3):
            out.write(os.urandom(fscopy._CHUNK))
    _stop_once_the_copy_began(repo, tmp_short / "dest", "big.bin")


def test_entries_past_the_cap_are_not_walked(tmp_short: Path) -> None:
    """Once the cap is reached the rest is skipped whole: a large tree after it (a
    node_modules of many files) is not walked just to be skipped."""
    src, dest = tmp_short / "src", tmp_short / "dest"
    (src / "a-big").mkdir(parents=True)
    (src / "a-big" / "blob").write_bytes(os.urandom(128 * 1024))
    (src / "z-tree" / "deep").mkdir(parents=True)
    (src / "z-tree" / "deep" / "f").write_text("f\n")
    dest.mkdir()
    walked: list[str] = []

    def check(rel: str) -> bool:
        walked.append(rel)
        return False

    plan = seed._plan(src, dest, ["a-big/", "z-tree/"], 65536, check)
    assert plan.skipped == ["a-big/", "z-tree/"] and plan.todo == []
    assert walked == ["blob"]  # only the first entry was sized
