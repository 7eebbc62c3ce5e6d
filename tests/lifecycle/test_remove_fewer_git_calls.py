"""Remove's fixed cost: the snapshot capture in fewer git processes, and the
quiescence probe reading /proc directly. Each still sees what the old path saw."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from xumd.lifecycle.snapshot import Snapshotter, WorkState
from xumd.processes import probes
from xumd.system.git import Git, GitError
from xumd.system.platform import portable

from tests.support.daemon import short_tmpdir
from tests.support.gitrepo import git, make_repo


def _capture(checkout: Path, *, full: bool = False) -> WorkState:
    snap = Snapshotter(Git(), checkout.parent / "tmp", checkout.parent / "archive")
    if full:

        async def never_clean(_checkout: Path, _git_dir: Path) -> bool:
            return False

        snap._clean = never_clean  # type: ignore[method-assign]
    return anyio.run(lambda: snap.capture(checkout))


def _both(checkout: Path) -> tuple[WorkState, WorkState]:
    return _capture(checkout), _capture(checkout, full=True)


def test_a_clean_checkout_is_heads_tree_without_writing_trees() -> None:
    repo = make_repo(short_tmpdir() / "r", {"a": "1", "d/b": "2"})
    fast, full = _both(repo)
    assert fast == full
    assert not fast.dirty
    assert fast.head == git(repo, "rev-parse", "HEAD").strip()


@pytest.mark.parametrize("change", ["staged", "unstaged", "untracked", "deleted", "mode"])
def test_each_kind_of_work_is_dirty_as_before(change: str) -> None:
    repo = make_repo(short_tmpdir() / "r", {"a": "1", "d/b": "2"})
    if change == "staged":
        (repo / "a").write_text("changed")
        git(repo, "add", "a")
    elif change == "unstaged":
        (repo / "a").write_text("changed")
    elif change == "untracked":
        (repo / "new").write_text("new")
    elif change == "deleted":
        (repo / "d" / "b").unlink()
    else:
        (repo / "a").chmod(0o755)
    fast, full = _both(repo)
    assert fast.dirty
    assert fast == full


def test_configuration_that_hides_work_from_status_does_not_hide_it_here() -> None:
    """`status.showUntrackedFiles=no` would make `git status` silent about a new file that
    `add -A` snapshots: the status call names its own options."""
    repo = make_repo(short_tmpdir() / "r")
    git(repo, "config", "status.showUntrackedFiles", "no")
    (repo / "new").write_text("new")
    fast, full = _both(repo)
    assert fast.dirty
    assert fast == full


def test_a_submodule_moved_under_an_ignore_setting_is_captured_as_before() -> None:
    base = short_tmpdir()
    sub = make_repo(base / "sub")
    repo = make_repo(base / "r")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "sub")
    git(repo, "commit", "-q", "-m", "sub")
    git(repo, "config", "diff.ignoreSubmodules", "all")
    (repo / "sub" / "more").write_text("x")
    git(repo / "sub", "add", "more")
    git(repo / "sub", "commit", "-q", "-m", "moved")
    fast, full = _both(repo)
    assert fast == full


def test_skip_worktree_entries_take_the_full_path() -> None:
    """A skip-worktree entry (index version 3) is invisible to `git status`; `add -A --sparse`
    may still record its file: such an index is never judged by status."""
    repo = make_repo(short_tmpdir() / "r", {"a": "1", "b": "2"})
    git(repo, "update-index", "--skip-worktree", "a")
    (repo / "a").write_text("changed")
    assert git(repo, "status", "--porcelain").strip() == ""
    fast, full = _both(repo)
    assert fast == full


def test_only_a_clean_version_2_index_is_judged_clean_by_status() -> None:
    """The fold's own guard, tested where it is the only guard: a clean checkout with a
    version 2 index is clean (the trees are not written); the same checkout with a version 4
    index is never judged by status (False: the full path), and neither is one whose index is
    missing; a dirty version 4 index is captured whole."""
    repo = make_repo(short_tmpdir() / "r", {"a": "1", "d/b": "2"})
    snap = Snapshotter(Git(), repo.parent / "tmp", repo.parent / "archive")
    git_dir = repo / ".git"

    def clean() -> bool:
        return anyio.run(lambda: snap._clean(repo, git_dir))

    assert clean() is True
    git(repo, "update-index", "--index-version", "4")
    assert clean() is False
    (repo / "a").write_text("changed")
    fast, full = _both(repo)
    assert fast.dirty and fast == full
    (git_dir / "index").rename(git_dir / "index.away")
    assert clean() is False


def test_an_unborn_head_fails_as_before() -> None:
    empty = short_tmpdir() / "e"
    empty.mkdir()
    git(empty, "init", "-q")
    with pytest.raises(GitError):
        _capture(empty)


# -- the quiescence probe ------------------------------------------------------------------------

HOLD = """
import os, sys, time
where, what = sys.argv[1], sys.argv[2]
keep = []
if what == "cwd":
    os.chdir(where)
elif what == "file":
    keep.append(open(os.path.join(where, "held"), "w"))
elif what == "dir":
    keep.append(os.open(where, os.O_RDONLY | os.O_DIRECTORY))
elif what == "deleted":
    path = os.path.join(where, "gone")
    keep.append(open(path, "w"))
    os.unlink(path)
print("ready", flush=True)
time.sleep(120)
"""


def _hold(started: list[subprocess.Popen[str]], where: Path, what: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(where), what],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    started.append(proc)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_the_probe_finds_cwd_and_open_files_and_nothing_else(
    started_procs: list[subprocess.Popen[str]],
) -> None:
    checkout = short_tmpdir()
    (checkout / "sub").mkdir()
    in_cwd = _hold(started_procs, checkout / "sub", "cwd")
    in_file = _hold(started_procs, checkout, "file")
    _hold(started_procs, checkout, "dir")  # a directory descriptor is not an open file
    _hold(started_procs, checkout, "deleted")  # nor a file deleted since
    _hold(started_procs, short_tmpdir(), "cwd")  # elsewhere
    found = probes.find_users(checkout, exclude_pids=set(), exclude_pgids=set())
    assert sorted((u.pid, u.where) for u in found) == sorted(
        [(in_cwd.pid, "cwd"), (in_file.pid, "open file")]
    )
    assert all(u.argv and u.argv[0] == sys.executable and u.since > 0 for u in found)
    # The portable backend's psutil scan (what macOS runs) sees the same holders.
    seen = portable.users_under(str(checkout.resolve()), set(), set(), 64)
    assert sorted((u.pid, u.where, u.name) for u in seen) == sorted(
        (u.pid, u.where, u.name) for u in found
    )


def test_the_probe_excuses_the_pids_and_groups_it_is_told_to(
    started_procs: list[subprocess.Popen[str]],
) -> None:
    checkout = short_tmpdir()
    by_pid = _hold(started_procs, checkout, "cwd")
    by_group = _hold(started_procs, checkout, "file")
    found = probes.find_users(checkout, exclude_pids={by_pid.pid}, exclude_pgids={by_group.pid})
    assert found == []
    assert len(probes.find_users(checkout, exclude_pids=set(), exclude_pgids=set())) == 2
    limited = probes.find_users(checkout, exclude_pids=set(), exclude_pgids=set(), limit=1)
    assert len(limited) == 1
