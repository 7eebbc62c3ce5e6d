"""Two limits for git, each forced with a real git that hangs: `git_timeout_s` bounds git's local
work (status, write-tree, worktree add: one repository on this machine), `fetch_timeout_s` the
one call that goes to the network on purpose (a create's base fetch), so a slow network neither
borrows the local bound nor is cut by it. A timeout names the setting that ended it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess, short_tmpdir, write_config
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import add_project, create, rpc_error
from tests.support.wait import until

LOCAL_S = 5.0
"""The local limit in these tests: what a real git's small steps stay under on the shared,
loaded machine (2 s did not: a `worktree add` outlived it before its hook), so that only the
hung step reaches it."""


@pytest.fixture
def base() -> Iterator[Path]:
    path = short_tmpdir("xumgl-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _daemon(base: Path, config: str) -> DaemonProcess:
    write_config(base / "root", config + "stop_grace_s = 0.5\n")
    return DaemonProcess(base / "root").start()


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def _clone_of_a_remote(base: Path) -> Path:
    seed = make_repo(base / "seed", {"README.md": "v1\n"})
    git(base, "clone", "-q", "--bare", str(seed), str(base / "remote.git"))
    git(base, "clone", "-q", str(base / "remote.git"), str(base / "repo"))
    return base / "repo"


@pytest.mark.reliability  # ~12 s: two git calls of the archive each wait out the limit
def test_a_hung_git_status_ends_at_git_timeout_s_and_the_archive_changes_nothing(
    base: Path,
) -> None:
    # A real git whose fsmonitor hook never answers: every status-like call in the checkout
    # hangs. The network limit is far away; only git_timeout_s can end it.
    daemon = _daemon(base, f"git_timeout_s = {LOCAL_S}\nfetch_timeout_s = 600.0\n")
    try:
        project = add_project(daemon, make_repo(base / "repo"))
        ws = create(daemon, project["id"], "a")["workspace"]
        path = Path(ws["path"])
        (path / "work.txt").write_text("unsaved\n")
        pidfile = base / "hook.pid"
        hook = base / "fsmonitor.sh"
        hook.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 600\n")
        hook.chmod(0o755)
        git(path, "config", "core.fsmonitor", str(hook))

        err = rpc_error(daemon, "workspace.archive", {"workspace_id": ws["id"]})
        assert err.kind == "timeout", err
        assert err.data["limit"] == "git_timeout_s" and err.data["limit_s"] == LOCAL_S, err.data
        assert err.data["waited_for"].startswith("git "), err.data
        assert f"(the limit: git_timeout_s = {LOCAL_S:g})" in err.message, err.message
        hung = int(pidfile.read_text())
        until(lambda: _gone(hung), 15, message="the hung fsmonitor hook killed with its git")
        # Nothing was half done: the workspace is active, the work in place.
        shown = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
        assert shown["state"] == "active" and not shown["interrupted"], shown
        assert (path / "work.txt").read_text() == "unsaved\n"

        git(path, "config", "--unset", "core.fsmonitor")
        archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        assert archived["snapshot"]["files"] == ["work.txt"], archived
    finally:
        daemon.close()


@pytest.mark.reliability  # ~10 s: the remote answers only after the local limit
def test_a_slow_fetch_has_fetch_timeout_s_not_git_timeout_s(base: Path) -> None:
    # The remote answers after the local limit has passed, well within the network one.
    repo = _clone_of_a_remote(base)
    helper = base / "slow-upload-pack.sh"
    helper.write_text(f'#!/bin/sh\nsleep {LOCAL_S + 2:g}\nexec git-upload-pack "$@"\n')
    helper.chmod(0o755)
    git(repo, "config", "remote.origin.uploadpack", str(helper))
    daemon = _daemon(base, f"git_timeout_s = {LOCAL_S}\nfetch_timeout_s = 60.0\n")
    try:
        project = add_project(daemon, repo)
        made = create(daemon, project["id"], "f", fetch=True)
        assert made["fetch"]["status"] == "fetched", made["fetch"]
        assert made["workspace"]["state"] == "active"
    finally:
        daemon.close()


def test_a_hung_fetch_ends_at_fetch_timeout_s_naming_it(base: Path) -> None:
    # The remote never answers; the local limit is far away: only fetch_timeout_s ends it.
    repo = _clone_of_a_remote(base)
    pidfile = base / "helper.pid"
    helper = base / "hang.sh"
    helper.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 600\n")
    helper.chmod(0o755)
    git(repo, "config", "remote.origin.uploadpack", str(helper))
    daemon = _daemon(base, "git_timeout_s = 600.0\nfetch_timeout_s = 3.0\n")
    try:
        project = add_project(daemon, repo)
        err = rpc_error(
            daemon, "workspace.create", {"project_id": project["id"], "name": "h", "fetch": True}
        )
        assert err.kind == "timeout", err
        assert err.data["limit"] == "fetch_timeout_s", err.data
        assert "(the limit: fetch_timeout_s = 3)" in err.message, err.message
        until(lambda: _gone(int(pidfile.read_text())), 15, message="the hung remote killed")
        assert daemon.call("workspace.list")["workspaces"] == []
    finally:
        daemon.close()


@pytest.mark.parametrize("key", ["git_timeout_s", "fetch_timeout_s"])
@pytest.mark.parametrize("value", ["0", "-1", '"soon"'])
def test_each_limit_refuses_a_value_that_is_no_deadline(base: Path, key: str, value: str) -> None:
    from xumd.base import config

    path = base / "config.toml"
    path.write_text(f"{key} = {value}\n")
    with pytest.raises(config.ConfigError, match=key):
        config.load(path)


def test_a_partial_clones_lazy_fetch_is_local_work_under_git_timeout_s(base: Path) -> None:
    # A blobless clone fetches a checkout's files from its promisor remote while `git worktree
    # add` runs: the network inside a local command. It stays under git_timeout_s (documented:
    # raise it for such repositories), whatever fetch_timeout_s says, and the timeout names it.
    seed = make_repo(base / "seed", {"a.txt": "a\n", "b.txt": "b\n"})
    git(base, "clone", "-q", "--bare", str(seed), str(base / "remote.git"))
    git(base / "remote.git", "config", "uploadpack.allowFilter", "true")
    url = f"file://{base / 'remote.git'}"
    git(base, "clone", "-q", "--filter=blob:none", "--no-checkout", url, str(base / "repo"))
    repo = base / "repo"
    pidfile = base / "helper.pid"
    helper = base / "hang.sh"
    helper.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 600\n")
    helper.chmod(0o755)
    git(repo, "config", "remote.origin.uploadpack", str(helper))
    daemon = _daemon(base, f"git_timeout_s = {LOCAL_S}\nfetch_timeout_s = 600.0\n")
    try:
        project = add_project(daemon, repo)
        err = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "w"})
        assert err.kind == "timeout", err
        assert err.data["limit"] == "git_timeout_s", err.data
        assert "git worktree add" in err.message, err
        assert f"git_timeout_s = {LOCAL_S:g}" in err.message, err
        until(lambda: _gone(int(pidfile.read_text())), 15, message="the hung promisor killed")
        assert daemon.call("workspace.list")["workspaces"] == []
    finally:
        daemon.close()
