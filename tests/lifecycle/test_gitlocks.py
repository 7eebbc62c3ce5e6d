"""Stale git lock files: cleared only when provably stale, reported with the path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
from xumd.system import gitlocks
from xumd.system.git import Git, GitLockBusy
from xumd.system.platform import linux

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import GIT_ENV, git, make_repo
from tests.support.lifecycle_helpers import add_project, branch_exists, create, rpc_error
from tests.support.platform import PORTABLE
from tests.support.wait import until


def _age(path: Path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_clear_stale_only_old_and_unheld(tmp_short: Path) -> None:
    repo = make_repo(tmp_short / "repo")
    git_dir = repo / ".git"
    old_free = git_dir / "index.lock"
    old_free.write_text("")
    _age(old_free, 3600)
    young = git_dir / "config.lock"
    young.write_text("")
    held = git_dir / "packed-refs.lock"
    held.write_text("")
    _age(held, 3600)
    ref_lock = git_dir / "refs" / "heads" / "main.lock"
    ref_lock.write_text("")
    _age(ref_lock, 3600)
    with open(held) as holder:  # a live process (this one) has it open
        report = gitlocks.clear_stale(git_dir)
        assert sorted(report.cleared) == sorted([str(old_free), str(ref_lock)])
        live = {entry["path"]: entry for entry in report.live}
        assert live[str(held)]["pid"] == os.getpid()
        assert live[str(young)]["pid"] is None
        assert held.exists() and young.exists()
        assert holder.read() == ""
    assert not old_free.exists() and not ref_lock.exists()


def test_create_clears_a_stale_index_lock_and_reports_it(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    repo = make_repo(tmp_short / "repo")
    project = add_project(daemon, repo)
    lock = repo / ".git" / "index.lock"
    lock.write_text("")
    _age(lock, 3600)  # left by a SIGKILLed git long ago; nobody holds it
    result = create(daemon, project["id"], "after-crash")
    assert result["workspace"]["state"] == "active"
    assert result["cleared_locks"] == [str(lock)]
    assert not lock.exists()


# -- the user's own git: a live lock with no descriptor open ---------------------------------


class UserCommit:
    """`git commit -a` run by the user, sitting in the editor: git holds `index.lock` (written
    and closed) until the editor returns. The editor waits on a FIFO the test writes to."""

    def __init__(self, repo: Path, ctl: Path, how: str = "cwd") -> None:
        self.repo = repo
        self.ctl = ctl
        ctl.mkdir(exist_ok=True)
        os.mkfifo(ctl / "go")
        (repo / "README.md").write_text("changed by the user\n")
        editor = (
            f'f() {{ : > "{ctl}/editing"; read line < "{ctl}/go"; echo "user message" > "$1"; }}; f'
        )
        env = {**os.environ, **GIT_ENV, "GIT_EDITOR": editor}
        argv = ["git", "commit", "-a"]
        cwd: Path = repo
        if how == "env":  # GIT_DIR/GIT_WORK_TREE, started elsewhere
            env.update(GIT_DIR=str(repo / ".git"), GIT_WORK_TREE=str(repo))
            cwd = ctl
        elif how == "arg":  # --git-dir= on the command line, started elsewhere
            argv = ["git", f"--git-dir={repo / '.git'}", f"--work-tree={repo}", "commit", "-a"]
            cwd = ctl
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        until((ctl / "editing").exists, 10, message="git commit in the editor")
        where = git(repo, "rev-parse", "--path-format=absolute", "--git-path", "index.lock")
        self.lock = Path(where.strip())  # in a linked worktree: its admin dir
        assert self.lock.exists()
        _age(self.lock, 3600)  # "old": the user went for coffee

    def finish(self) -> str:
        with open(self.ctl / "go", "w") as go:
            go.write("done\n")
        out, _ = self.proc.communicate(timeout=20)
        assert self.proc.returncode == 0, out
        return out

    def abandon(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def user_commit(tmp_short: Path) -> Iterator[Callable[..., UserCommit]]:
    made: list[UserCommit] = []

    def start(repo: Path, how: str = "cwd") -> UserCommit:
        commit = UserCommit(repo, tmp_short / f"ctl{len(made)}", how)
        made.append(commit)
        return commit

    yield start
    for commit in made:
        commit.abandon()


@pytest.mark.parametrize("how", ["cwd", "env", "arg"])
def test_lock_of_a_running_user_git_is_live(
    tmp_short: Path, user_commit: Callable[..., UserCommit], how: str
) -> None:
    repo = make_repo(tmp_short / "repo")
    commit = user_commit(repo, how)
    assert gitlocks.open_holders([commit.lock]) == {}  # nobody has it open: not the proof
    report = gitlocks.clear_stale(repo / ".git")
    assert report.cleared == []
    live = {entry["path"]: entry for entry in report.live}
    assert live[str(commit.lock)]["pid"] == commit.proc.pid
    assert commit.lock.exists()
    commit.finish()
    assert "user message" in git(repo, "log", "-1", "--format=%s")


def test_create_leaves_the_users_commit_alone(
    daemon: DaemonProcess, tmp_short: Path, user_commit: Callable[..., UserCommit]
) -> None:
    repo = make_repo(tmp_short / "repo")
    project = add_project(daemon, repo)
    commit = user_commit(repo)
    result = create(daemon, project["id"], "while-committing")
    assert result["workspace"]["state"] == "active"
    assert result["cleared_locks"] == []
    assert commit.lock.exists()
    commit.finish()  # the user's commit completes: its index was never taken away
    assert git(repo, "log", "-1", "--format=%s").strip() == "user message"
    assert git(repo, "status", "--porcelain").strip() == ""
    assert git(repo, "show", "HEAD:README.md") == "changed by the user\n"


def test_lock_our_git_needs_is_busy_naming_the_users_git(
    daemon: DaemonProcess, tmp_short: Path, user_commit: Callable[..., UserCommit]
) -> None:
    repo = make_repo(tmp_short / "repo")
    project = add_project(daemon, repo)
    commit = user_commit(repo)
    # A ref lock in the way of the branch the create makes, while the user's git runs in this
    # repository: its owner is not provably gone, so it is neither removed nor waited out.
    ref_lock = repo / ".git" / "refs" / "heads" / "mine.lock"
    ref_lock.write_text("")
    _age(ref_lock, 3600)
    err = rpc_error(
        daemon, "workspace.create", {"project_id": project["id"], "name": "x", "branch": "mine"}
    )
    assert err.kind == "busy", err
    assert err.data["lock"] == str(ref_lock)
    assert err.data["holders"][0]["pid"] == commit.proc.pid
    assert str(commit.proc.pid) in err.message and str(ref_lock) in err.message
    assert ref_lock.exists()
    assert daemon.call("workspace.list", {})["workspaces"] == []
    assert not branch_exists(repo, "mine")
    commit.finish()
    # The user's git is gone: now the lock is provably stale, cleared, and the create works.
    result = create(daemon, project["id"], "x", branch="mine")
    assert result["cleared_locks"] == [str(ref_lock)]


class _WatchedGit(Git):
    """The real runner; the test learns when it starts waiting for a lock (to release it then)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.waiting = anyio.Event()

    async def _lock_released(self, lock: Path) -> bool:
        self.waiting.set()
        return await super()._lock_released(lock)


@pytest.mark.anyio
async def test_git_waits_boundedly_for_a_lock_then_runs(tmp_short: Path) -> None:
    repo = make_repo(tmp_short / "repo")
    lock = repo / ".git" / "refs" / "heads" / "feature.lock"
    lock.write_text("")  # the user's git is about to finish with it
    runner = _WatchedGit(lock_wait_s=30.0)
    async with anyio.create_task_group() as tg:

        async def user_git_finishes() -> None:
            await runner.waiting.wait()
            lock.unlink()

        tg.start_soon(user_git_finishes)
        await runner.run(repo, "branch", "feature")
    assert branch_exists(repo, "feature")


@pytest.mark.anyio
async def test_git_lock_that_stays_is_busy_after_the_bound(tmp_short: Path) -> None:
    repo = make_repo(tmp_short / "repo")
    lock = repo / ".git" / "refs" / "heads" / "feature.lock"
    lock.write_text("")
    # A wait without its bound would never end: the deadline turns that into a failure.
    with anyio.fail_after(10), pytest.raises(GitLockBusy) as caught:
        await Git(lock_wait_s=0.3).run(repo, "branch", "feature")
    assert caught.value.kind.value == "busy"
    assert caught.value.data["lock"] == str(lock)
    assert caught.value.data["holders"][0]["lock"] == str(lock)
    assert "pid" not in caught.value.data["holders"][0]  # no owner found: said, not invented
    assert lock.exists() and not branch_exists(repo, "feature")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# Out of descriptors, the /proc scan cannot look at the processes: it must not conclude that
# nobody holds the lock. One descriptor is left free: enough to list /proc, not to look inside.
_SCAN_WITHOUT_DESCRIPTORS = r"""
import os, sys
from pathlib import Path
from xumd.system import gitlocks, procstat
common = Path(sys.argv[1])
hog = []
while True:
    try:
        hog.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        break
os.close(hog.pop())
try:
    report = gitlocks.clear_stale(common)
except OSError as exc:
    print("REFUSED", exc.errno)
else:
    print("CLEARED", report.cleared)
"""


def test_lock_scan_out_of_descriptors_fails_closed(tmp_short: Path) -> None:
    repo = make_repo(tmp_short / "repo")
    lock = repo / ".git" / "packed-refs.lock"
    lock.write_text("")
    _age(lock, 3600)
    # A live tool (not a git) keeps the lock open: only the descriptor scan can tell.
    with open(lock, "rb") as held:
        holder = subprocess.Popen(["sleep", "600"], stdin=held)
    try:
        done = subprocess.run(
            [
                "prlimit",
                "--nofile=64:64",
                "--",
                sys.executable,
                "-c",
                _SCAN_WITHOUT_DESCRIPTORS,
                str(repo / ".git"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if PORTABLE and "REFUSED" not in done.stdout:
            # psutil reads a process's descriptors with the one left: the scan completes and
            # finds the holder, so the lock is kept as live.
            assert f"pid={holder.pid}" in done.stdout and "CLEARED []" in done.stdout, done
        else:
            assert done.stdout.startswith("REFUSED"), done.stdout + done.stderr[-2000:]
        assert lock.exists()
    finally:
        holder.kill()
        holder.wait(10)


@pytest.mark.anyio
async def test_lock_in_a_linked_worktree_names_the_users_git(
    tmp_short: Path, user_commit: Callable[..., UserCommit]
) -> None:
    repo = make_repo(tmp_short / "repo")
    linked = tmp_short / "linked"
    git(repo, "worktree", "add", "-q", "-b", "side", str(linked))
    commit = user_commit(linked)  # the user commits in the linked worktree
    assert commit.lock.parent.parent.name == "worktrees"
    (linked / "new.txt").write_text("x\n")
    with pytest.raises(GitLockBusy) as caught:
        await Git(lock_wait_s=0.2).run(linked, "add", "new.txt")
    assert caught.value.data["lock"] == str(commit.lock)
    assert caught.value.data["holders"][0]["pid"] == commit.proc.pid
    report = gitlocks.clear_stale(repo / ".git")
    assert str(commit.lock) not in report.cleared and commit.lock.exists()
    commit.finish()


def test_a_zombie_git_of_the_repository_holds_no_lock(tmp_short: Path) -> None:
    """A git that ended but was not reaped yet (a zombie) holds nothing: its repository's
    stale lock is cleared, not kept live in its name."""
    repo = make_repo(tmp_short / "repo")
    fake = tmp_short / "bin" / "git"  # its command name is `git`
    fake.parent.mkdir()
    true = shutil.which("true")
    assert true is not None
    shutil.copy(true, fake)
    lock = repo / ".git" / "index.lock"
    lock.write_text("")
    _age(lock, gitlocks.STALE_AFTER_S + 60)
    proc = subprocess.Popen([str(fake)], cwd=repo)  # not waited for: a zombie once it ends
    try:
        until(lambda: (linux.stat_fields(proc.pid) or ["?"])[0] == "Z")
        assert gitlocks.git_processes(repo / ".git") == []
        report = gitlocks.clear_stale(repo / ".git")
        assert report.cleared == [str(lock)] and not lock.exists()
    finally:
        proc.wait()
