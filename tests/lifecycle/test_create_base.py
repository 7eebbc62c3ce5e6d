"""workspace.create with a fresh base (fetch), and in big repositories (sparse checkout,
submodules): real bare remotes, real git, a real daemon."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import types
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from xum_client.errors import XumRpcError
from xum_protocol.models.workspace import WorkspaceCreateParams
from xumd.lifecycle import basefetch

from tests.cli.test_workspace import xum
from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import git, make_repo
from tests.support.holds import hold_env, release, wait_held
from tests.support.lifecycle_helpers import add_project, create, rpc_error
from tests.support.wait import until


@pytest.fixture
def remote(tmp_short: Path) -> Path:
    """A bare 'remote' and a clone of it (the project), the clone tracking origin/main."""
    seed = make_repo(tmp_short / "seed", {"README.md": "v1\n"})
    bare = tmp_short / "remote.git"
    git(tmp_short, "clone", "-q", "--bare", str(seed), str(bare))
    return bare


@pytest.fixture
def repo(tmp_short: Path, remote: Path) -> Path:
    clone = tmp_short / "repo"
    git(tmp_short, "clone", "-q", str(remote), str(clone))
    return clone


def _push_new_commit(tmp_short: Path, remote: Path, text: str) -> str:
    """Someone else pushes to the remote: the project's clone does not have it yet."""
    other = tmp_short / f"other-{text}"
    git(tmp_short, "clone", "-q", str(remote), str(other))
    (other / "README.md").write_text(text + "\n")
    git(other, "commit", "-q", "-am", text)
    git(other, "push", "-q", "origin", "main")
    return git(other, "rev-parse", "HEAD").strip()


def _hung_helper_runs(pid: int) -> bool:
    """The helper exec'd `sleep 600`: that pid running that command (not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return cmdline[:2] == [b"sleep", b"600"] and state != "Z"


@pytest.fixture
def fast_fetch_daemon(root: Path) -> Iterator[DaemonProcess]:
    write_config(root, "fetch_timeout_s = 2.0\n")
    proc = DaemonProcess(root).start()
    yield proc
    proc.close()


def test_fetch_takes_the_new_remote_commit(
    daemon: DaemonProcess, repo: Path, remote: Path, tmp_short: Path
) -> None:
    project = add_project(daemon, repo)
    old = git(repo, "rev-parse", "HEAD").strip()
    new = _push_new_commit(tmp_short, remote, "v2")
    stale = create(daemon, project["id"], "nofetch")
    assert stale["base_commit"] == old
    assert stale["fetch"] is None
    fresh = create(daemon, project["id"], "fresh", fetch=True)
    assert fresh["fetch"]["status"] == "fetched"
    assert fresh["fetch"]["remote"] == "origin"
    assert fresh["fetch"]["stale"] is False
    assert fresh["base_commit"] == new
    assert fresh["workspace"]["base"] == new
    assert (Path(fresh["workspace"]["path"]) / "README.md").read_text() == "v2\n"
    # The user's own branch is never moved by the fetch.
    assert git(repo, "rev-parse", "refs/heads/main").strip() == old


def test_fetch_from_project_config(
    daemon: DaemonProcess, repo: Path, remote: Path, tmp_short: Path
) -> None:
    (repo / ".xum").mkdir()
    (repo / ".xum" / "config.toml").write_text("[create]\nfetch = true\n")
    project = add_project(daemon, repo)
    new = _push_new_commit(tmp_short, remote, "v3")
    result = create(daemon, project["id"], "cfg")
    assert result["fetch"]["status"] == "fetched"
    assert result["base_commit"] == new
    # The call's own `fetch: false` wins over the config.
    assert create(daemon, project["id"], "off", fetch=False)["fetch"] is None


def test_fetch_of_a_remote_tracking_base(
    daemon: DaemonProcess, repo: Path, remote: Path, tmp_short: Path
) -> None:
    project = add_project(daemon, repo)
    new = _push_new_commit(tmp_short, remote, "v4")
    result = create(daemon, project["id"], "rt", fetch=True, base="origin/main")
    assert result["base_commit"] == new
    assert result["fetch"]["base_ref"] == "origin/main"


def test_unreachable_remote_refuses_then_stale_allowed(
    daemon: DaemonProcess, repo: Path, tmp_short: Path
) -> None:
    project = add_project(daemon, repo)
    git(repo, "remote", "set-url", "origin", str(tmp_short / "gone.git"))
    old = git(repo, "rev-parse", "HEAD").strip()
    err = rpc_error(
        daemon, "workspace.create", {"project_id": project["id"], "name": "x", "fetch": True}
    )
    assert err.kind == "fetch_failed"
    assert err.data["remote"] == "origin"
    assert "gone.git" in err.message
    # Refused before anything was made: no row, no branch, no checkout.
    assert daemon.call("workspace.list")["workspaces"] == []
    assert git(repo, "branch", "--list", "xum/x").strip() == ""
    result = create(daemon, project["id"], "x", fetch=True, allow_stale_base=True)
    assert result["fetch"]["status"] == "failed"
    assert result["fetch"]["stale"] is True
    assert "gone.git" in result["fetch"]["error"]
    assert result["base_commit"] == old


def test_no_remote_is_fetch_failed(daemon: DaemonProcess, tmp_short: Path) -> None:
    lonely = make_repo(tmp_short / "lonely")
    project = add_project(daemon, lonely)
    err = rpc_error(
        daemon, "workspace.create", {"project_id": project["id"], "name": "x", "fetch": True}
    )
    assert err.kind == "fetch_failed"
    assert "no remote" in err.message


def test_fetch_with_directory_runtime_is_invalid(daemon: DaemonProcess, tmp_short: Path) -> None:
    plain = tmp_short / "plain"
    plain.mkdir()
    project = add_project(daemon, plain)
    err = rpc_error(
        daemon,
        "workspace.create",
        {"project_id": project["id"], "name": "d", "runtime": "directory", "fetch": True},
    )
    assert err.kind == "invalid_params"


def _hang_fetches(repo: Path, tmp_short: Path) -> Path:
    """Make `repo`'s remote hang (an upload-pack that never answers); the file where each
    started helper writes its pid."""
    pidfile = tmp_short / "helper.pid"
    helper = tmp_short / "hang.sh"
    helper.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 600\n")
    helper.chmod(0o755)
    git(repo, "config", "remote.origin.uploadpack", str(helper))
    return pidfile


def test_hung_fetch_hits_the_deadline_and_is_tree_killed(
    fast_fetch_daemon: DaemonProcess, repo: Path, tmp_short: Path
) -> None:
    """An upload-pack that never answers (a remote that hangs): the fetch is killed at
    `fetch_timeout_s`, with the hung helper, and the create answers `timeout`."""
    daemon = fast_fetch_daemon
    project = add_project(daemon, repo)
    pidfile = _hang_fetches(repo, tmp_short)
    err = rpc_error(
        daemon, "workspace.create", {"project_id": project["id"], "name": "h", "fetch": True}
    )
    assert err.kind == "timeout"
    assert err.data["waited_for"] == "git fetch origin"
    # The helper was started (the fetch reached it) and is gone with the killed fetch: git's
    # tree is killed before the create answers, so no wait is needed here.
    assert not _hung_helper_runs(int(pidfile.read_text()))
    assert daemon.call("workspace.list")["workspaces"] == []
    stale = create(daemon, project["id"], "h", fetch=True, allow_stale_base=True)
    assert stale["fetch"]["status"] == "timeout"
    assert stale["fetch"]["stale"] is True


def test_create_queued_behind_a_hung_fetch_waits_only_its_deadline(
    fast_fetch_daemon: DaemonProcess, repo: Path, tmp_short: Path
) -> None:
    """Creates that fetch one repository take turns (basefetch's lock): behind a hung fetch, a
    queue of creates each waits at most `fetch_timeout_s` for its turn, then answers `timeout`
    with nothing made; never an unbounded wait for the one ahead."""
    from concurrent.futures import ThreadPoolExecutor

    daemon = fast_fetch_daemon
    project = add_project(daemon, repo)
    pidfile = _hang_fetches(repo, tmp_short)

    def attempt(name: str) -> XumRpcError:
        return rpc_error(
            daemon, "workspace.create", {"project_id": project["id"], "name": name, "fetch": True}
        )

    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(attempt, "q0")
        until(pidfile.exists, timeout=30, message="the first fetch reached the hung remote")
        queued = [pool.submit(attempt, f"q{n}") for n in (1, 2)]
        errors = [first.result(), *(f.result() for f in queued)]
    assert [e.kind for e in errors] == ["timeout"] * 3
    assert "for another fetch" not in errors[0].message
    assert any("for another fetch" in e.message for e in errors[1:]), [e.message for e in errors]
    assert daemon.call("workspace.list")["workspaces"] == []


# -- big repositories ----------------------------------------------------------------------------


def test_sparse_patterns_inherited(daemon: DaemonProcess, tmp_short: Path) -> None:
    repo = make_repo(
        tmp_short / "big",
        {"a/x/f": "1\n", "b/f": "2\n", "c/f": "3\n", "top": "t\n"},
    )
    git(repo, "sparse-checkout", "set", "--cone", "a")
    project = add_project(daemon, repo)
    result = create(daemon, project["id"], "sp")
    path = Path(result["workspace"]["path"])
    assert result["sparse"] == {"cone": True, "patterns": ["a"]}
    assert (path / "a" / "x" / "f").read_text() == "1\n"
    assert (path / "top").exists()  # cone mode keeps top-level files
    assert not (path / "b").exists()
    assert not (path / "c").exists()
    assert git(path, "status", "--porcelain").strip() == ""
    assert git(path, "sparse-checkout", "list").split() == ["a"]
    # The main checkout's own patterns are untouched.
    assert git(repo, "sparse-checkout", "list").split() == ["a"]


def test_full_checkout_when_main_is_not_sparse(daemon: DaemonProcess, tmp_short: Path) -> None:
    repo = make_repo(tmp_short / "full", {"a/f": "1\n", "b/f": "2\n"})
    project = add_project(daemon, repo)
    result = create(daemon, project["id"], "full")
    assert result["sparse"] is None
    assert (Path(result["workspace"]["path"]) / "b" / "f").exists()


def _repo_with_submodule(tmp_short: Path) -> tuple[Path, Path]:
    sub = make_repo(tmp_short / "subsrc", {"lib.txt": "lib\n"})
    main = make_repo(tmp_short / "main", {"m.txt": "m\n"})
    git(main, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "libs/sub")
    git(main, "commit", "-q", "-m", "add submodule")
    return main, sub


def test_submodules_borrow_the_main_checkouts_objects_offline(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    main, sub = _repo_with_submodule(tmp_short)
    url = str(sub)
    # Offline: the submodule's own remote is gone; only the main checkout's copy is left.
    shutil.move(str(sub), str(tmp_short / "subsrc-gone"))
    project = add_project(daemon, main)
    result = create(daemon, project["id"], "withsub")
    path = Path(result["workspace"]["path"])
    assert result["submodules"] == [{"path": "libs/sub", "status": "initialized", "error": None}]
    assert (path / "libs" / "sub" / "lib.txt").read_text() == "lib\n"
    # Its remote is the real one again (a later fetch goes where the user expects).
    assert git(path / "libs" / "sub", "remote", "get-url", "origin").strip() == url
    status = git(path, "submodule", "status")
    assert status.startswith(" "), status  # not `-` (uninitialised), `+` or `U`
    # The objects were linked, not copied: the submodule's objects share inodes.
    common = Path(git(main, "rev-parse", "--path-format=absolute", "--git-common-dir").strip())
    src_objects = {
        os.stat(p).st_ino
        for p in (common / "modules" / "libs" / "sub" / "objects").rglob("*")
        if p.is_file() and len(p.parent.name) == 2
    }
    sub_git = Path(
        git(path / "libs" / "sub", "rev-parse", "--path-format=absolute", "--git-dir").strip()
    )
    new_objects = {
        os.stat(p).st_ino
        for p in (sub_git / "objects").rglob("*")
        if p.is_file() and len(p.parent.name) == 2
    }
    assert src_objects and new_objects <= src_objects


def test_submodule_not_initialised_in_main_is_skipped(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    main, _sub = _repo_with_submodule(tmp_short)
    clone = tmp_short / "clone"
    git(tmp_short, "clone", "-q", str(main), str(clone))  # submodules not initialised
    project = add_project(daemon, clone)
    result = create(daemon, project["id"], "nosub")
    assert result["submodules"] == [{"path": "libs/sub", "status": "skipped", "error": None}]


def test_submodule_whose_commit_is_missing_locally_fails_but_create_succeeds(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    main, sub = _repo_with_submodule(tmp_short)
    # A branch pointing the submodule at a commit the main checkout's copy does not have.
    (sub / "lib.txt").write_text("newer\n")
    git(sub, "commit", "-q", "-am", "newer")
    newer = git(sub, "rev-parse", "HEAD").strip()
    git(main, "checkout", "-q", "-b", "bump")
    git(main, "update-index", "--cacheinfo", f"160000,{newer},libs/sub")
    git(main, "commit", "-q", "-m", "bump")
    git(main, "checkout", "-q", "main")
    shutil.move(str(sub), str(tmp_short / "subsrc-gone"))
    project = add_project(daemon, main)
    result = create(daemon, project["id"], "bumped", branch="bump")
    assert result["workspace"]["state"] == "active"
    [info] = result["submodules"]
    assert info["status"] == "failed"
    assert info["error"]


def test_submodule_name_that_climbs_out_is_refused(daemon: DaemonProcess, tmp_short: Path) -> None:
    """A `.gitmodules` name like `../../victim` (anyone's commit can carry one) must not make
    the daemon clone another repository on this machine from outside the modules directory."""
    main, sub = _repo_with_submodule(tmp_short)  # a real one: `.git/modules` exists
    # `<main>/.git/modules/../../victim` is `<main>/victim`: a repository planted there.
    git(tmp_short, "clone", "-q", "--bare", str(sub), str(main / "victim"))
    commit = git(sub, "rev-parse", "HEAD").strip()
    git(main, "config", "-f", ".gitmodules", "submodule.../../victim.path", "libs/evil")
    git(main, "config", "-f", ".gitmodules", "submodule.../../victim.url", str(sub))
    git(main, "update-index", "--add", "--cacheinfo", f"160000,{commit},libs/evil")
    git(main, "add", ".gitmodules")
    git(main, "commit", "-q", "-m", "evil submodule")
    project = add_project(daemon, main)
    result = create(daemon, project["id"], "evil")
    by_path = {s["path"]: s for s in result["submodules"]}
    assert by_path["libs/evil"] == {
        "path": "libs/evil",
        "status": "failed",
        "error": "unsafe submodule name",
    }
    assert by_path["libs/sub"]["status"] == "initialized"
    assert not (Path(result["workspace"]["path"]) / "libs" / "evil" / "lib.txt").exists()


def test_project_config_fetch_of_the_wrong_type_is_refused(
    daemon: DaemonProcess, repo: Path
) -> None:
    (repo / ".xum").mkdir()
    (repo / ".xum" / "config.toml").write_text('[create]\nfetch = "yes"\n')
    project = add_project(daemon, repo)
    err = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "t"})
    assert err.kind == "invalid_params"
    assert "[create] fetch" in err.message
    assert daemon.call("workspace.list")["workspaces"] == []


def test_cli_new_with_fetch(
    daemon: DaemonProcess, repo: Path, remote: Path, tmp_short: Path
) -> None:
    project = add_project(daemon, repo)
    new = _push_new_commit(tmp_short, remote, "v9")
    out = xum(daemon, "ws", "new", project["name"], "viacli", "--fetch").stdout
    assert "fetch: fetched from origin" in out
    assert f"base: {new}" in out
    git(repo, "remote", "set-url", "origin", str(tmp_short / "gone.git"))
    refused = xum(daemon, "ws", "new", project["name"], "nope", "--fetch", ok=False)
    assert refused.returncode != 0
    assert "gone.git" in refused.stderr
    stale = xum(daemon, "ws", "new", project["name"], "stale", "--fetch", "--allow-stale-base")
    assert "STALE base used" in stale.stdout


def test_sparse_workspace_archives_and_unarchives_its_work(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    """A sparse checkout's uncommitted work survives archive/unarchive (the snapshot holds it),
    and it comes back sparse: the cone it had is re-applied (lifecycle/sparse_cone.py)."""
    repo = make_repo(tmp_short / "big", {"a/f": "1\n", "a/g": "g\n", "b/f": "2\n", "top": "t\n"})
    git(repo, "sparse-checkout", "set", "--cone", "a")
    project = add_project(daemon, repo)
    ws = create(daemon, project["id"], "sp")["workspace"]
    path = Path(ws["path"])
    (path / "a" / "f").write_text("edited\n")
    (path / "a" / "new.txt").write_text("new\n")
    (path / "a" / "g").write_text("staged\n")
    git(path, "add", "a/g")
    (path / "a" / "g").write_text("staged then edited\n")
    archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert sorted(archived["snapshot"]["files"]) == ["a/f", "a/g", "a/new.txt"]
    restored = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})["restored"]
    assert restored["sparse"] == {"cone": True, "patterns": ["a"]}
    assert restored["sparse_kept"] == []
    assert (path / "a" / "f").read_text() == "edited\n"
    assert (path / "a" / "new.txt").read_text() == "new\n"
    assert (path / "a" / "g").read_text() == "staged then edited\n"
    assert (path / "top").read_text() == "t\n"
    assert not (path / "b").exists()
    assert git(path, "sparse-checkout", "list").split() == ["a"]
    assert sorted(git(path, "status", "--porcelain=v1", "--untracked-files=all").splitlines()) == [
        " M a/f",
        "?? a/new.txt",
        "MM a/g",
    ]
    assert git(path, "show", ":a/g") == "staged\n"  # the index as it was


def test_sparse_unarchive_keeps_the_workspaces_own_cone(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    """The cone re-applied is the workspace's own as archived (widened there by the user), not
    the main checkout's, which changed meanwhile."""
    repo = make_repo(tmp_short / "big", {"a/f": "1\n", "b/f": "2\n", "c/f": "3\n"})
    git(repo, "sparse-checkout", "set", "--cone", "a")
    project = add_project(daemon, repo)
    ws = create(daemon, project["id"], "own")["workspace"]
    path = Path(ws["path"])
    git(path, "sparse-checkout", "add", "b")
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    git(repo, "sparse-checkout", "set", "--cone", "c")
    restored = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})["restored"]
    assert restored["sparse"]["patterns"] == ["a", "b"]
    assert (path / "a" / "f").exists() and (path / "b" / "f").exists()
    assert not (path / "c").exists()
    assert git(path, "status", "--porcelain=v1", "--untracked-files=all") == ""


def test_sparse_unarchive_keeps_work_outside_the_cone_and_reports_it(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    """Files outside the cone that carry work (a tracked file the user wrote back and staged,
    an untracked file, a preserved ignored file) are kept, their directories added to the cone,
    and reported; a directory holding only clean files stays out."""
    repo = make_repo(
        tmp_short / "big",
        {
            "a/f": "1\n",
            "b/f": "2\n",
            "c/d/f": "3\n",
            "e/f": "5\n",
            ".gitignore": "*.local\n",
        },
    )
    git(repo, "sparse-checkout", "set", "--cone", "a")
    (repo / ".xum").mkdir()
    (repo / ".xum" / "config.toml").write_text('[scripts]\npreserve = ["**/*.local"]\n')
    project = add_project(daemon, repo)
    ws = create(daemon, project["id"], "out")["workspace"]
    path = Path(ws["path"])
    assert not (path / "b").exists()
    (path / "b").mkdir()
    (path / "b" / "f").write_text("mine\n")  # tracked, outside the cone, written by the user
    # and staged: clean against the index, git alone would sparsify it off the disk.
    git(path, "add", "--sparse", "b/f")
    (path / "c" / "d").mkdir(parents=True)
    (path / "c" / "d" / "mine.txt").write_text("untracked\n")
    (path / "e").mkdir()
    (path / "e" / "keep.local").write_text("preserved\n")
    archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert sorted(archived["snapshot"]["files"]) == ["b/f", "c/d/mine.txt"]
    assert archived["dropped"]["preserved"] == ["e/keep.local"]
    restored = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})["restored"]
    assert (path / "b" / "f").read_text() == "mine\n"
    assert (path / "c" / "d" / "mine.txt").read_text() == "untracked\n"
    assert (path / "e" / "keep.local").read_text() == "preserved\n"
    assert restored["sparse_kept"] == ["b/f", "c/d/mine.txt", "e/keep.local"]
    assert restored["sparse"]["patterns"] == ["a", "b", "c/d", "e"]
    assert (path / "c" / "d" / "f").read_text() == "3\n"  # its directory is in the cone now
    assert git(path, "sparse-checkout", "list").split() == ["a", "b", "c/d", "e"]
    assert sorted(git(path, "status", "--porcelain=v1", "--untracked-files=all").splitlines()) == [
        "?? c/d/mine.txt",
        "M  b/f",
    ]


def test_full_workspace_unarchives_full(daemon: DaemonProcess, tmp_short: Path) -> None:
    """A workspace whose checkout was full when archived (its sparse checkout disabled by the
    user) comes back full even though the main checkout is sparse."""
    repo = make_repo(tmp_short / "big", {"a/f": "1\n", "b/f": "2\n"})
    git(repo, "sparse-checkout", "set", "--cone", "a")
    project = add_project(daemon, repo)
    ws = create(daemon, project["id"], "full")["workspace"]
    path = Path(ws["path"])
    git(path, "sparse-checkout", "disable")
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    restored = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})["restored"]
    assert restored["sparse"] is None
    assert (path / "b" / "f").read_text() == "2\n"
    assert "S " not in git(path, "ls-files", "-t")  # no entry left skipped


def test_workspace_with_submodule_archives_and_unarchives(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    main, _sub = _repo_with_submodule(tmp_short)
    project = add_project(daemon, main)
    ws = create(daemon, project["id"], "subws")["workspace"]
    path = Path(ws["path"])
    (path / "m.txt").write_text("edited\n")
    archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert archived["snapshot"]["files"] == ["m.txt"]
    restored = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert restored["workspace"]["state"] == "active"
    assert (path / "m.txt").read_text() == "edited\n"
    assert restored["restored"]["submodules"] == [
        {"path": "libs/sub", "status": "initialized", "error": None}
    ]
    assert (path / "libs" / "sub" / "lib.txt").read_text() == "lib\n"
    removed = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    assert removed["removed"] is True


def test_concurrent_creates_with_fetch_both_succeed(
    daemon: DaemonProcess, repo: Path, remote: Path, tmp_short: Path
) -> None:
    """Two fetches of one remote at once update the same remote-tracking refs: git's ref locks
    make one wait or retry (git.py), never fail the other create."""
    from concurrent.futures import ThreadPoolExecutor

    project = add_project(daemon, repo)
    new = _push_new_commit(tmp_short, remote, "v5")
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(lambda n: create(daemon, project["id"], f"par{n}", fetch=True), range(4))
        )
    assert [r["base_commit"] for r in results] == [new] * 4
    assert all(r["fetch"]["status"] == "fetched" for r in results)


def test_concurrent_sparse_creates_all_succeed(daemon: DaemonProcess, tmp_short: Path) -> None:
    """`sparse-checkout set` in a new worktree writes the repository's shared config
    (extensions.worktreeConfig): parallel creates must not trip over its lock."""
    from concurrent.futures import ThreadPoolExecutor

    repo = make_repo(tmp_short / "big", {"a/f": "1\n", "b/f": "2\n"})
    git(repo, "sparse-checkout", "set", "--cone", "a")
    project = add_project(daemon, repo)
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda n: create(daemon, project["id"], f"sp{n}"), range(6)))
    for result in results:
        path = Path(result["workspace"]["path"])
        assert result["sparse"]["patterns"] == ["a"]
        assert (path / "a" / "f").exists() and not (path / "b").exists()


def test_concurrent_creates_with_submodules_all_initialise(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    main, _sub = _repo_with_submodule(tmp_short)
    project = add_project(daemon, main)
    with ThreadPoolExecutor(5) as pool:
        results = list(pool.map(lambda n: create(daemon, project["id"], f"sm{n}"), range(5)))
    assert [r["submodules"][0]["status"] for r in results] == ["initialized"] * 5


def test_project_config_swapped_for_a_fifo_does_not_block(
    daemon: DaemonProcess, repo: Path
) -> None:
    """The main checkout's `.xum/config.toml` is read for `[create] fetch` on the event loop: a
    FIFO there must not block the daemon (no writer will ever come)."""
    (repo / ".xum").mkdir()
    os.mkfifo(repo / ".xum" / "config.toml")
    project = add_project(daemon, repo)
    # Refused at once as unreadable (createconfig reads it first), never a hang.
    err = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "fifo"})
    assert err.kind == "invalid_params"
    assert daemon.call("daemon.status")["pid"] > 0


def test_sparse_unarchive_whose_cone_cannot_be_set_is_undone(root: Path, tmp_short: Path) -> None:
    """`sparse-checkout set` failing after the restore (its lock held) refuses the unarchive:
    the new checkout is taken back and the workspace stays archived with its snapshot; the
    next unarchive restores everything, sparse."""
    point, holds = "workspace.unarchive.hold", tmp_short / "holds"
    daemon = DaemonProcess(root, env=hold_env(point, holds)).start()
    try:
        repo = make_repo(tmp_short / "big", {"a/f": "1\n", "b/f": "2\n"})
        git(repo, "sparse-checkout", "set", "--cone", "a")
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "lk")["workspace"]
        path = Path(ws["path"])
        (path / "a" / "f").write_text("edited\n")
        daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        out: dict[str, Any] = {}

        def run() -> None:
            try:
                out["result"] = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
            except XumRpcError as exc:
                out["error"] = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        wait_held(point, holds)
        info = Path(git(path, "rev-parse", "--absolute-git-dir").strip()) / "info"
        info.mkdir(exist_ok=True)
        (info / "sparse-checkout.lock").touch()
        release(point, holds)
        thread.join(timeout=60)
        assert not thread.is_alive()
        assert "sparse-checkout" in str(out["error"])
        got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
        assert got["state"] == "archived"
        assert not os.path.lexists(path)
        release(point, holds)  # the next arrival passes at once
        again = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
        assert again["restored"]["sparse"]["patterns"] == ["a"]
        assert (path / "a" / "f").read_text() == "edited\n"
        assert not (path / "b").exists()
    finally:
        daemon.close()


def test_sparse_cone_with_names_git_quotes(daemon: DaemonProcess, tmp_short: Path) -> None:
    """`sparse-checkout list` C-quotes a name with a quote, a backslash or a non-ASCII byte;
    create and unarchive give git the real names back (a quoted one would be another
    directory: the checkout would miss the user's cone)."""
    names = ["a b", "é", 'q"x', "back\\slash"]
    repo = make_repo(tmp_short / "big", {**{f"{n}/f": f"{n}\n" for n in names}, "z/f": "z\n"})
    git(repo, "sparse-checkout", "set", "--cone", *names)
    project = add_project(daemon, repo)
    result = create(daemon, project["id"], "q")
    path = Path(result["workspace"]["path"])
    assert sorted(result["sparse"]["patterns"]) == sorted(names)
    for n in names:
        assert (path / n / "f").read_text() == f"{n}\n"
    assert not (path / "z").exists()
    (path / "é" / "f").write_text("edited\n")
    daemon.call("workspace.archive", {"workspace_id": result["workspace"]["id"]})
    restored = daemon.call("workspace.unarchive", {"workspace_id": result["workspace"]["id"]})
    assert sorted(restored["restored"]["sparse"]["patterns"]) == sorted(names)
    assert restored["restored"]["sparse_kept"] == []
    assert (path / "é" / "f").read_text() == "edited\n"
    assert (path / 'q"x' / "f").read_text() == 'q"x\n'
    assert not (path / "z").exists()


def test_cli_unarchive_reports_the_cone_and_what_it_kept(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    repo = make_repo(tmp_short / "big", {"a/f": "1\n", "b/f": "2\n"})
    git(repo, "sparse-checkout", "set", "--cone", "a")
    project = add_project(daemon, repo)
    path = Path(create(daemon, project["id"], "cli")["workspace"]["path"])
    (path / "b").mkdir()
    (path / "b" / "mine.txt").write_text("mine\n")
    ref = f"{project['name']}/cli"
    xum(daemon, "ws", "archive", ref)
    done = xum(daemon, "ws", "unarchive", ref)
    assert "sparse: a b" in done.stdout
    assert "kept outside the archived cone (their directories added): b/mine.txt" in done.stdout
    assert (path / "b" / "mine.txt").read_text() == "mine\n"


def test_sparse_index_workspace_archives_and_unarchives(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    """A workspace whose user turned on the sparse index (directory entries in the index):
    its work outside and inside the cone is captured and restored, and it comes back sparse."""
    repo = make_repo(tmp_short / "big", {"a/f": "1\n", "b/f": "2\n", "c/f": "3\n"})
    git(repo, "sparse-checkout", "set", "--cone", "a")
    project = add_project(daemon, repo)
    ws = create(daemon, project["id"], "si")["workspace"]
    path = Path(ws["path"])
    git(path, "sparse-checkout", "set", "--cone", "--sparse-index", "a")
    (path / "a" / "f").write_text("edited\n")
    (path / "b").mkdir()
    (path / "b" / "mine.txt").write_text("mine\n")
    archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert sorted(archived["snapshot"]["files"]) == ["a/f", "b/mine.txt"]
    restored = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})["restored"]
    assert restored["sparse_kept"] == ["b/mine.txt"]
    assert (path / "a" / "f").read_text() == "edited\n"
    assert (path / "b" / "mine.txt").read_text() == "mine\n"
    assert not (path / "c").exists()


@pytest.mark.parametrize(
    ("path", "inside"),
    [
        ("top.txt", True),  # the top level is always checked out
        ("a/b/f.txt", True),  # in the cone
        ("a/b/c/f.txt", True),  # under the cone
        ("a/f.txt", True),  # directly in a directory leading to the cone
        ("a/x/f.txt", False),  # a sibling of the cone
        ("ab/f.txt", False),  # a name that only starts like the cone's parent
        ("c/f.txt", False),
    ],
)
def test_in_cone_follows_git_cone_mode(path: str, inside: bool) -> None:
    """What sparse_cone keeps on disk at unarchive must match what git's cone mode writes: a
    path it wrongly calls outside widens the cone and is reported kept for nothing."""
    from xumd.lifecycle.sparse_cone import in_cone

    assert in_cone(path, ["/a/b/"]) is inside


def test_remote_of_a_tracking_ref_is_the_longest_matching_remote() -> None:
    """Remote names may hold slashes: `refs/remotes/team/x/main` is remote `team/x`'s branch
    `main` when both `team` and `team/x` exist, and no remote's when none matches."""
    from xumd.lifecycle.basefetch import _remote_of

    remotes = ["team", "team/x", "origin"]
    assert _remote_of("refs/remotes/team/x/main", remotes) == "team/x"
    assert _remote_of("refs/remotes/team/main", remotes) == "team"
    assert _remote_of("refs/remotes/teamx/main", remotes) is None
    assert _remote_of("", remotes) is None


def _git_answer(ok: bool, text: str = "") -> Any:
    """What `Git.run` answers (a CommandResult's shape), for the fetch-race tests below."""
    output = types.SimpleNamespace(text=lambda: text, tail_text=lambda _n: text)
    return types.SimpleNamespace(ok=ok, timed_out=False, output=output, describe=lambda: "failed")


class _OneRemoteGit:
    """A git whose only remote is `origin`; each test answers its own fetches (a race with
    another fetch, or with another create's `worktree add`, is a fault a real git cannot be
    made to lose on demand)."""

    async def out(self, repo: Path, *args: str, **kw: object) -> str:
        return "origin"

    async def fetch(self, kw: dict[str, Any]) -> Any:
        raise NotImplementedError

    async def run(self, repo: Path, *args: str, **kw: Any) -> Any:
        if args[0] != "fetch":
            return _git_answer(False)
        return await self.fetch(kw)


def test_fetch_retry_after_a_ref_race_shares_the_one_deadline(tmp_short: Path) -> None:
    """A fetch that lost a ref race to someone else's fetch is tried once more, within what is
    left of `fetch_timeout_s`: the two tries together never outlast the one deadline."""
    timeouts: list[float] = []

    class RacingGit(_OneRemoteGit):
        async def fetch(self, kw: dict[str, Any]) -> Any:
            timeouts.append(float(kw["timeout_s"]))
            await anyio.sleep(0.3)
            if len(timeouts) == 1:
                return _git_answer(False, "error: cannot lock ref 'refs/remotes/origin/main'")
            return _git_answer(True)

    params = WorkspaceCreateParams(project_id="p_1", name="w", fetch=True)
    anyio.run(basefetch.fetch_base, RacingGit(), tmp_short, params, "xum/w", 1.0)  # type: ignore[arg-type]
    assert len(timeouts) == 2
    assert timeouts[0] == pytest.approx(1.0, abs=0.05)
    assert timeouts[1] <= 0.75  # what the first try left, not a second full deadline


def test_fetch_during_another_creates_worktree_add_waits_for_it_and_retries(
    tmp_short: Path,
) -> None:
    """`git worktree add` writes the new worktree's HEAD as a placeholder first; a fetch at that
    moment fails its connectivity check on it ("bad object worktrees/<name>/HEAD": seen with
    concurrent creates that fetch). The fetch waits for the daemon's admin lock (the add holds
    it), then tries once more, instead of refusing the create."""
    seen: list[str] = []

    class AddingGit(_OneRemoteGit):
        @contextlib.asynccontextmanager
        async def admin_lock(self, repo: Path, *, wait_s: float = 60.0) -> AsyncIterator[None]:
            seen.append("admin_lock")
            yield

        async def fetch(self, kw: dict[str, Any]) -> Any:
            seen.append("fetch")
            if seen.count("fetch") == 1:
                return _git_answer(False, "fatal: bad object worktrees/par0/HEAD")
            return _git_answer(True)

    params = WorkspaceCreateParams(project_id="p_1", name="w", fetch=True)
    _, info = anyio.run(basefetch.fetch_base, AddingGit(), tmp_short, params, "xum/w", 5.0)  # type: ignore[arg-type]
    assert seen == ["fetch", "admin_lock", "fetch"]
    assert info.status == "fetched"
