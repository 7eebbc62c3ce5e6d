"""workspace.create {carry}: the main checkout's uncommitted work (staged, unstaged, untracked,
not ignored) taken into the new checkout byte for byte, staged kept staged and untracked kept
untracked; `move` then takes exactly those paths out of the main checkout, leaving a path
changed meanwhile. Refused `not_safe` mid-merge and mid-rebase; a failure after the checkout
exists leaves no workspace and the main checkout as it was. Real repositories, a real daemon."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, run_xum
from tests.support.gitrepo import git, make_repo
from tests.support.holds import hold_env, release, wait_held
from tests.support.lifecycle_helpers import add_project, create, rpc_error, worktrees

BINARY = bytes(range(256)) * 40 + b"\x00\xff\x00"

CARRIED = {
    "README.md",  # unstaged edit
    "src/app.py",  # staged edit, then a further unstaged edit
    "staged.txt",  # staged new file
    "notes/untracked.txt",  # untracked
    "data.bin",  # untracked binary
    "link",  # untracked symlink
    "bin/tool.sh",  # executable bit added (unstaged)
    "gone.txt",  # deleted (unstaged)
    "old.txt",  # renamed (staged): the source ...
    "new.txt",  # ... and the destination
}


def _repo(base: Path) -> Path:
    repo = make_repo(
        base / "repo",
        {
            "README.md": "hello\n",
            "src/app.py": "print('app')\n",
            "bin/tool.sh": "#!/bin/sh\necho tool\n",
            "gone.txt": "to be deleted\n",
            "old.txt": "to be renamed\n",
            ".gitignore": "*.log\n",
        },
    )
    return repo


def _make_work(repo: Path) -> None:
    (repo / "README.md").write_text("hello, edited and not staged\n")
    (repo / "src" / "app.py").write_text("print('staged')\n")
    git(repo, "add", "src/app.py")
    (repo / "src" / "app.py").write_text("print('staged, then edited')\n")
    (repo / "staged.txt").write_text("staged but not committed\n")
    git(repo, "add", "staged.txt")
    (repo / "notes").mkdir()
    (repo / "notes" / "untracked.txt").write_text("untracked, not ignored\n")
    (repo / "data.bin").write_bytes(BINARY)
    (repo / "link").symlink_to("README.md")
    tool = repo / "bin" / "tool.sh"
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    (repo / "gone.txt").unlink()
    git(repo, "mv", "old.txt", "new.txt")
    (repo / "debug.log").write_text("ignored: never carried\n")


def _status(checkout: Path) -> str:
    """git's view of the uncommitted state: staged vs unstaged vs untracked, per path."""
    return git(checkout, "status", "--porcelain=v1", "--untracked-files=all")


def _files(checkout: Path) -> dict[str, tuple[str, bytes, bool]]:
    """Every entry but .git and the ignored debug.log: kind, bytes (or link target), exec bit."""
    found: dict[str, tuple[str, bytes, bool]] = {}
    for dirpath, dirnames, filenames in os.walk(checkout):
        dirnames[:] = [d for d in dirnames if not (dirpath == str(checkout) and d == ".git")]
        for name in filenames:
            full = Path(dirpath, name)
            rel = str(full.relative_to(checkout))
            if rel in ("debug.log", ".git"):  # ignored; a worktree's `.git` file
                continue
            st = full.lstat()
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", os.fsencode(os.readlink(full)), False)
            else:
                found[rel] = ("file", full.read_bytes(), bool(st.st_mode & stat.S_IXUSR))
    return found


def _carry_refs(repo: Path) -> str:
    return git(repo, "for-each-ref", "--format=%(refname)", "refs/xum/carry")


@pytest.fixture
def repo(tmp_short: Path) -> Path:
    return _repo(tmp_short)


def test_copy_carries_every_kind_byte_for_byte_and_leaves_main(
    daemon: DaemonProcess, repo: Path
) -> None:
    _make_work(repo)
    status, files = _status(repo), _files(repo)
    index = git(repo, "ls-files", "-s")
    project = add_project(daemon, repo)
    result = create(daemon, project["id"], "cp", carry="copy")
    new = Path(result["workspace"]["path"])
    carried = result["carried"]
    assert set(carried["files"]) == CARRIED
    assert set(carried["staged"]) == {"src/app.py", "staged.txt", "old.txt", "new.txt"}
    assert set(carried["untracked"]) == {"notes/untracked.txt", "data.bin", "link"}
    assert carried["mode"] == "copy" and carried["moved"] is False and carried["left"] == []
    # The new checkout: the same files byte for byte (modes too), the same staged/unstaged/
    # untracked split, the same index entries; the ignored file not carried.
    assert _files(new) == files
    assert _status(new) == status
    assert git(new, "ls-files", "-s") == index
    assert not (new / "debug.log").exists()
    assert (new / "bin" / "tool.sh").stat().st_mode & stat.S_IXUSR
    assert (new / "data.bin").read_bytes() == BINARY
    # The main checkout is as it was, and no carry ref is left behind.
    assert _status(repo) == status and _files(repo) == files
    assert git(repo, "ls-files", "-s") == index
    assert (repo / "debug.log").exists()
    assert _carry_refs(repo) == ""


def test_move_takes_exactly_the_carried_work_out_of_main(daemon: DaemonProcess, repo: Path) -> None:
    _make_work(repo)
    status, files = _status(repo), _files(repo)
    project = add_project(daemon, repo)
    result = create(daemon, project["id"], "mv", carry="move")
    new = Path(result["workspace"]["path"])
    assert result["carried"]["moved"] is True and result["carried"]["left"] == []
    assert set(result["carried"]["files"]) == CARRIED
    assert _files(new) == files and _status(new) == status
    # The main checkout is at HEAD: nothing staged, changed or untracked; the ignored file stays.
    assert _status(repo) == ""
    assert (repo / "README.md").read_text() == "hello\n"
    assert (repo / "gone.txt").read_text() == "to be deleted\n"
    assert not (repo / "new.txt").exists() and (repo / "old.txt").exists()
    assert not (repo / "notes").exists() and not (repo / "data.bin").exists()
    assert not os.path.lexists(repo / "link")
    assert not (repo / "bin" / "tool.sh").stat().st_mode & stat.S_IXUSR
    assert (repo / "debug.log").read_text() == "ignored: never carried\n"
    assert git(repo, "diff", "--cached", "--name-only") == ""
    assert _carry_refs(repo) == ""


def test_move_leaves_a_file_changed_after_the_verification(tmp_short: Path) -> None:
    repo = _repo(tmp_short)
    _make_work(repo)
    files = _files(repo)
    point = "workspace.create.carry.hold_before_move"
    holds = tmp_short / "holds"
    daemon = DaemonProcess(tmp_short / "root", env=hold_env(point, holds)).start()
    try:
        project = add_project(daemon, repo)
        answer: dict[str, Any] = {}
        call = threading.Thread(
            target=lambda: answer.update(create(daemon, project["id"], "mv", carry="move"))
        )
        call.start()
        try:
            wait_held(point, holds)
            # The workspace holds the work already; the user edits the main checkout now.
            (repo / "README.md").write_text("edited again in the main checkout\n")
            (repo / "data.bin").write_bytes(b"changed")
        finally:
            release(point, holds)
            call.join(60)
        assert not call.is_alive()
        carried = answer["carried"]
        assert carried["moved"] is False
        left = {e["path"]: e["reason"] for e in carried["left"]}
        assert set(left) == {"README.md", "data.bin"}, left
        assert all("changed" in why for why in left.values())
        # The changed files are as the user left them; the rest went back to HEAD.
        assert (repo / "README.md").read_text() == "edited again in the main checkout\n"
        assert (repo / "data.bin").read_bytes() == b"changed"
        assert not (repo / "staged.txt").exists() and (repo / "gone.txt").exists()
        assert set(_status(repo).splitlines()) == {" M README.md", "?? data.bin"}
        # The new checkout has what was carried; the ref stays while something was left.
        new = Path(answer["workspace"]["path"])
        assert _files(new) == files
        assert _carry_refs(repo).strip() == f"refs/xum/carry/{answer['workspace']['id']}"
    finally:
        daemon.close()


def _refused(daemon: DaemonProcess, project: dict[str, Any], repo: Path, why: str) -> None:
    status = _status(repo)
    err = rpc_error(
        daemon, "workspace.create", {"project_id": project["id"], "name": "c", "carry": "copy"}
    )
    assert err.kind == "not_safe", err
    assert why in str(err), err
    assert daemon.call("workspace.list", {})["workspaces"] == []
    assert len(worktrees(repo)) == 1
    assert _status(repo) == status
    assert _carry_refs(repo) == ""


def test_mid_merge_is_refused(daemon: DaemonProcess, repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "side")
    (repo / "README.md").write_text("side\n")
    git(repo, "commit", "-qam", "side")
    git(repo, "checkout", "-q", "main")
    (repo / "README.md").write_text("main\n")
    git(repo, "commit", "-qam", "main")
    git(repo, "merge", "side", check=False)
    assert (repo / ".git" / "MERGE_HEAD").exists()
    _refused(daemon, add_project(daemon, repo), repo, "a merge is in progress")


def test_mid_rebase_is_refused(daemon: DaemonProcess, repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "side")
    (repo / "README.md").write_text("side\n")
    git(repo, "commit", "-qam", "side")
    git(repo, "checkout", "-q", "main")
    (repo / "README.md").write_text("main\n")
    git(repo, "commit", "-qam", "main")
    git(repo, "checkout", "-q", "side")
    git(repo, "rebase", "main", check=False)
    assert (repo / ".git" / "rebase-merge").exists() or (repo / ".git" / "rebase-apply").exists()
    _refused(daemon, add_project(daemon, repo), repo, "a rebase")


def test_unmerged_paths_are_refused(daemon: DaemonProcess, repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "side")
    (repo / "README.md").write_text("side\n")
    git(repo, "commit", "-qam", "side")
    git(repo, "checkout", "-q", "main")
    (repo / "README.md").write_text("main\n")
    git(repo, "commit", "-qam", "main")
    git(repo, "merge", "side", check=False)
    (repo / ".git" / "MERGE_HEAD").unlink()  # no merge in progress; the conflict stays
    _refused(daemon, add_project(daemon, repo), repo, "unmerged paths")


def test_nested_repository_is_refused_by_name(daemon: DaemonProcess, repo: Path) -> None:
    make_repo(repo / "vendor" / "lib")
    _refused(daemon, add_project(daemon, repo), repo, "vendor/lib")


def test_base_elsewhere_and_directory_runtime_are_invalid(
    daemon: DaemonProcess, repo: Path
) -> None:
    first = git(repo, "rev-parse", "HEAD").strip()
    (repo / "README.md").write_text("next\n")
    git(repo, "commit", "-qam", "next")
    project = add_project(daemon, repo)
    for extra in ({"base": first}, {"runtime": "directory"}):
        err = rpc_error(
            daemon,
            "workspace.create",
            {"project_id": project["id"], "name": "c", "carry": "move", **extra},
        )
        assert err.kind == "invalid_params", (extra, err)
    assert daemon.call("workspace.list", {})["workspaces"] == []


def test_a_failure_after_the_checkout_leaves_main_untouched_and_no_workspace(
    tmp_short: Path,
) -> None:
    repo = _repo(tmp_short)
    _make_work(repo)
    status, files = _status(repo), _files(repo)
    index = git(repo, "ls-files", "-s")
    env = {"XUM_FAULT": "workspace.create.carry.after_restore:raise"}
    daemon = DaemonProcess(tmp_short / "root", env=env).start()
    try:
        project = add_project(daemon, repo)
        err = rpc_error(
            daemon, "workspace.create", {"project_id": project["id"], "name": "m", "carry": "move"}
        )
        assert err.kind == "internal", err
        assert daemon.call("workspace.list", {})["workspaces"] == []
        assert len(worktrees(repo)) == 1
        assert "xum/m" not in git(repo, "branch", "--list")
        assert _status(repo) == status and _files(repo) == files
        assert git(repo, "ls-files", "-s") == index
        assert _carry_refs(repo) == ""
        # The same create goes through once the fault has fired.
        done = create(daemon, project["id"], "m", carry="move")
        assert done["carried"]["moved"] is True
        assert _files(Path(done["workspace"]["path"])) == files
    finally:
        daemon.close()


def test_cli_ws_new_carry_move(daemon: DaemonProcess, repo: Path) -> None:
    _make_work(repo)
    files = _files(repo)
    add_project(daemon, repo, name="proj")
    done = run_xum(daemon, "ws", "new", "proj", "cli", "--carry", "move")
    assert done.returncode == 0, done.stderr
    assert "carried 10 path(s)" in done.stdout and "moved out of the main checkout" in done.stdout
    new = Path(daemon.call("workspace.list", {})["workspaces"][0]["path"])
    assert _files(new) == files
    assert _status(repo) == ""


def test_a_clean_main_checkout_carries_nothing(daemon: DaemonProcess, repo: Path) -> None:
    (repo / "debug.log").write_text("ignored\n")
    project = add_project(daemon, repo)
    result = create(daemon, project["id"], "clean", carry="move")
    assert result["carried"]["files"] == [] and result["carried"]["left"] == []
    assert _status(Path(result["workspace"]["path"])) == "" and _status(repo) == ""
    assert (repo / "debug.log").exists()
    assert _carry_refs(repo) == ""
