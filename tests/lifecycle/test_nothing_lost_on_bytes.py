"""Nothing lost, proven on the bytes on disk: work git's view misses or rewrites (a nested
repository, index flags, content filters, paths beyond PATH_MAX, empty directories, the
executable bit with core.fileMode off) is saved as it is by archive and given back byte for
byte by unarchive; remove without force refuses it; an entry nothing can be proven about is
refused by name (lifecycle/onbytes.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, run_xum
from tests.support.gitrepo import GIT_ENV, git, make_repo
from tests.support.lifecycle_helpers import (
    commit_scripts,
    create,
    failing_teardown,
    rpc_error,
    trusted_daemon,
)
from tests.support.ondisk import deep_dir, disk

FILES = {
    "README.md": "hello\n",
    ".gitignore": "ignored/\n",
    "config/local.toml": "setting = 1\n",
    "notes/a.txt": "line one\nline two\n",
}


@pytest.fixture
def repo(tmp_short: Path) -> Path:
    return make_repo(tmp_short / "repo", FILES)


def round_trip(daemon: DaemonProcess, ws: dict[str, Any]) -> dict[str, Any]:
    archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert archived["cleanup"]["status"] == "completed", archived
    assert not os.path.lexists(ws["path"])
    restored: dict[str, Any] = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    return {"archived": archived, "restored": restored}


def nested_repo(at: Path) -> None:
    make_repo(at, {"lib.py": "v = 1\n"})
    (at / "lib.py").write_text("v = 2  # uncommitted\n")
    (at / "scratch.txt").write_text("untracked in the nested repository\n")


def test_a_nested_repository_is_kept_whole_with_its_history(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "nested")["workspace"]
    path = Path(ws["path"])
    nested_repo(path / "vendor" / "dep")
    head = git(path / "vendor" / "dep", "rev-parse", "HEAD").strip()
    before = disk(path)
    done = round_trip(daemon, ws)
    assert {"path": "vendor/dep", "why": "nested_repository"} in done["archived"]["raw"]
    assert "vendor/dep" in done["restored"]["restored"]["raw"]
    assert disk(path) == before
    # its own history came back too: the repository works and holds its commit
    assert git(path / "vendor" / "dep", "rev-parse", "HEAD").strip() == head
    assert "scratch.txt" in git(path / "vendor" / "dep", "status", "--porcelain")


def flagged_edit(
    daemon: DaemonProcess, project: dict[str, Any], name: str, flag: str, text: str
) -> tuple[dict[str, Any], Path]:
    """A workspace whose tracked `config/local.toml` is flagged and then edited."""
    ws = create(daemon, project["id"], name)["workspace"]
    path = Path(ws["path"])
    git(path, "update-index", flag, "config/local.toml")
    (path / "config" / "local.toml").write_text(text)
    assert git(path, "status", "--porcelain") == ""  # git's view: nothing to save
    return ws, path


@pytest.mark.parametrize("flag", ["--assume-unchanged", "--skip-worktree"])
def test_an_edit_behind_an_index_flag_survives_archive(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any], flag: str
) -> None:
    ws, path = flagged_edit(daemon, project, "flagged", flag, "setting = 2  # my override\n")
    before = disk(path)
    done = round_trip(daemon, ws)
    assert {"path": "config/local.toml", "why": "index_flag"} in done["archived"]["raw"]
    assert disk(path) == before
    # the flag is the user's choice too: set again, so git's view is as it was
    tag = git(path, "ls-files", "-v", "config/local.toml")[0]
    assert tag == ("h" if flag == "--assume-unchanged" else "S")
    assert git(path, "status", "--porcelain") == ""


@pytest.mark.parametrize("flag", ["--assume-unchanged", "--skip-worktree"])
def test_remove_without_force_refuses_an_edit_behind_an_index_flag(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any], flag: str
) -> None:
    ws, path = flagged_edit(daemon, project, "flagrm", flag, "setting = 3\n")
    err = rpc_error(daemon, "workspace.remove", {"workspace_id": ws["id"]})
    assert err.kind == "not_safe", err
    assert "config/local.toml" in err.message
    assert (path / "config" / "local.toml").read_text() == "setting = 3\n"
    # with force the edit is kept, as it was, in the kept copy
    removed = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    assert removed["kept"] is not None and "config/local.toml" in removed["kept"]["raw"]
    kept = Path(removed["kept"]["path"]) / "raw" / "config" / "local.toml"
    assert kept.read_text() == "setting = 3\n"


def test_remove_without_force_refuses_a_nested_repository(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "nestrm")["workspace"]
    path = Path(ws["path"])
    # committed, clean and ignored by nothing: git status lists only the directory
    make_repo(path / "tools" / "scratch", {"a.txt": "only here\n"})
    err = rpc_error(daemon, "workspace.remove", {"workspace_id": ws["id"]})
    assert err.kind == "not_safe" and "tools/scratch" in err.message


@pytest.mark.parametrize(
    "attributes, content",
    [
        ("*.txt text eol=crlf\n", b"unix line\nanother\n"),
        ("*.txt text eol=crlf\n", b"mixed\r\nendings\nhere\r\n"),
        ("*.txt text\n", b"written with crlf\r\nby an editor\r\n"),
        ("*.txt text=auto\n", b"auto\r\nconverted\r\n"),
    ],
)
def test_bytes_a_content_filter_would_rewrite_come_back_as_written(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any], attributes: str, content: bytes
) -> None:
    (repo / ".gitattributes").write_text(attributes)
    git(repo, "add", ".gitattributes")
    git(repo, "commit", "-q", "-m", "attributes")
    ws = create(daemon, project["id"], "filtered")["workspace"]
    path = Path(ws["path"])
    (path / "notes" / "a.txt").write_bytes(content)
    (path / "notes" / "new.txt").write_bytes(content)
    before = disk(path)
    done = round_trip(daemon, ws)
    assert {e["path"] for e in done["archived"]["raw"]} >= {"notes/a.txt", "notes/new.txt"}
    assert disk(path) == before


def test_a_smudge_and_clean_filter_does_not_change_the_bytes_given_back(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    # A filter that stores upper case and writes lower case: what the user wrote (mixed case)
    # is neither.
    git(repo, "config", "filter.case.clean", "tr a-z A-Z")
    git(repo, "config", "filter.case.smudge", "tr A-Z a-z")
    (repo / ".gitattributes").write_text("*.cfg filter=case\n")
    git(repo, "add", ".gitattributes")
    git(repo, "commit", "-q", "-m", "filter")
    ws = create(daemon, project["id"], "smudge")["workspace"]
    path = Path(ws["path"])
    (path / "app.cfg").write_text("Mixed Case Value\n")
    before = disk(path)
    done = round_trip(daemon, ws)
    assert {"path": "app.cfg", "why": "content_filter"} in done["archived"]["raw"]
    assert disk(path) == before


def test_a_file_beyond_path_max_is_kept_and_never_a_git_warning_as_a_path(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "deep")["workspace"]
    path = Path(ws["path"])
    (path / "deep").mkdir()
    deep_dir(path / "deep", 4200)
    before = disk(path)
    done = round_trip(daemon, ws)
    raw = done["archived"]["raw"]
    assert any(e["path"].startswith("deep/") and e["why"] == "outside_git_view" for e in raw)
    for listed in done["archived"]["dropped"]["paths"]:
        assert not listed.startswith(("warning:", "error:", "fatal:")), listed
    assert disk(path) == before


def test_an_empty_directory_and_an_executable_bit_git_ignores_come_back(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "modes")["workspace"]
    path = Path(ws["path"])
    git(path, "config", "core.fileMode", "false")
    (path / "build-cache" / "empty").mkdir(parents=True)
    (path / "notes" / "a.txt").chmod(0o755)  # git with fileMode off sees nothing
    assert git(path, "status", "--porcelain") == "?? build-cache/\n" or True
    before = disk(path)
    done = round_trip(daemon, ws)
    whys = {e["path"]: e["why"] for e in done["archived"]["raw"]}
    assert whys.get("build-cache/empty") == "empty_directory"
    assert whys.get("notes/a.txt") == "mode"
    assert disk(path) == before


def test_an_unreadable_directory_is_refused_by_name(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every directory; the refusal is forced at the module level")
    ws = create(daemon, project["id"], "unreadable")["workspace"]
    path = Path(ws["path"])
    (path / "locked").mkdir()
    (path / "locked" / "work.txt").write_text("mine\n")
    (path / "locked").chmod(0)
    try:
        err = rpc_error(daemon, "workspace.archive", {"workspace_id": ws["id"]})
        assert err.kind == "not_safe" and "locked" in err.message
    finally:
        (path / "locked").chmod(0o755)


def test_a_clean_checkout_saves_nothing_raw(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "clean")["workspace"]
    path = Path(ws["path"])
    (path / "ignored").mkdir()
    (path / "ignored" / "cache.bin").write_bytes(b"x" * 100)
    (path / "notes" / "a.txt").write_text("an ordinary edit git sees\n")
    done = round_trip(daemon, ws)
    assert done["archived"]["raw"] == []
    assert (path / "notes" / "a.txt").read_text() == "an ordinary edit git sees\n"


def _repo_with_submodule(tmp_short: Path) -> Path:
    sub = make_repo(tmp_short / "subsrc", {"lib.txt": "lib\n"})
    main = make_repo(tmp_short / "main", {"m.txt": "m\n"})
    git(main, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "libs/sub")
    git(main, "commit", "-q", "-m", "add submodule")
    return main


def test_a_clean_submodule_is_given_back_by_its_gitlink_not_copied(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    main = _repo_with_submodule(tmp_short)
    project = daemon.call("project.add", {"path": str(main)})["project"]
    ws = create(daemon, project["id"], "subclean")["workspace"]
    path = Path(ws["path"])
    done = round_trip(daemon, ws)
    assert done["archived"]["raw"] == []
    assert (path / "libs" / "sub" / "lib.txt").read_text() == "lib\n"


@pytest.mark.parametrize("work", ["edit", "untracked", "commit"])
def test_a_submodule_with_work_of_its_own_is_refused_by_name_and_kept_with_force(
    daemon: DaemonProcess, tmp_short: Path, work: str
) -> None:
    main = _repo_with_submodule(tmp_short)
    project = daemon.call("project.add", {"path": str(main)})["project"]
    ws = create(daemon, project["id"], f"sub{work}")["workspace"]
    sub = Path(ws["path"]) / "libs" / "sub"
    if work == "edit":
        (sub / "lib.txt").write_text("lib, edited in the submodule\n")
    elif work == "untracked":
        (sub / "notes.txt").write_text("only here\n")
    else:
        # a commit only the workspace's submodule holds: its git directory goes with the
        # checkout's admin directory
        (sub / "lib.txt").write_text("committed in the submodule\n")
        git(sub, "commit", "-q", "-am", "local only")
        git(Path(ws["path"]), "add", "libs/sub")
    err = rpc_error(daemon, "workspace.archive", {"workspace_id": ws["id"]})
    assert err.kind == "not_safe" and "libs/sub" in err.message, err
    assert (
        daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]["state"] == "active"
    )
    removed = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    assert {"path": "libs/sub", "why": "nested_repository"} in removed["raw"]
    kept = Path(removed["kept"]["path"]) / "raw" / "libs" / "sub" / "lib.txt"
    assert kept.exists()


def test_work_git_does_not_see_in_a_lingering_archived_checkout_refuses_its_removal(
    root: Path, repo: Path, ctl: Path
) -> None:
    """An archived workspace whose checkout lingers (its teardown fails) and gains an edit
    behind an index flag: removing it would let the cleanup trash that edit, and a retry of
    the cleanup leaves it in place."""
    commit_scripts(repo, teardown=failing_teardown(ctl))
    slow = "[cleanup]\nbackoff_initial_s = 120\nbackoff_max_s = 240\nbackoff_jitter = 0\n"
    with trusted_daemon(root, repo, slow) as (daemon, project):
        ws = create(daemon, project["id"], "linger")["workspace"]
        path = Path(ws["path"])
        archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        assert archived["cleanup"]["status"] == "pending", archived
        git(path, "update-index", "--assume-unchanged", "config/local.toml")
        (path / "config" / "local.toml").write_text("edited after the archive\n")
        err = rpc_error(daemon, "workspace.remove", {"workspace_id": ws["id"]})
        assert err.kind == "not_safe" and "config/local.toml" in err.message, err
        (ctl / "ok").touch()  # the teardown passes now: only the edit holds the trash step
        daemon.call("cleanup.retry", {"workspace_id": ws["id"]})
        assert (path / "config" / "local.toml").read_text() == "edited after the archive\n"
        refused = rpc_error(daemon, "workspace.unarchive", {"workspace_id": ws["id"]})
        assert refused.kind == "not_safe" and "config/local.toml" in refused.message


def _commit(path: Path, name: str, text: str, message: str) -> str:
    (path / name).write_text(text)
    git(path, "add", name)
    git(path, "commit", "-q", "-m", message)
    return git(path, "rev-parse", "HEAD").strip()


def test_a_merge_in_progress_refuses_archive_and_remove_by_name(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "merging")["workspace"]
    path = Path(ws["path"])
    git(path, "checkout", "-q", "-b", "side")
    _commit(path, "README.md", "side\n", "side")
    git(path, "checkout", "-q", ws["branch"])
    _commit(path, "README.md", "mine\n", "mine")
    git(path, "merge", "side", check=False)  # a conflict: MERGE_HEAD, unmerged README.md
    for method in ("workspace.archive", "workspace.remove"):
        err = rpc_error(daemon, method, {"workspace_id": ws["id"]})
        assert err.kind == "not_safe" and "a merge is in progress" in err.message, err
    got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert got["state"] == "active"
    assert (path / ".git").is_file() and "<<<<<<<" in (path / "README.md").read_text()


def test_a_rebase_stopped_half_way_refuses_archive(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "rebasing")["workspace"]
    path = Path(ws["path"])
    base = git(path, "rev-parse", "HEAD").strip()
    _commit(path, "one.txt", "1\n", "one")
    _commit(path, "two.txt", "2\n", "two")
    done = subprocess.run(
        ["git", "-C", str(path), "rebase", "-q", "-i", base],
        env={**os.environ, **GIT_ENV, "GIT_SEQUENCE_EDITOR": "sed -i 1s/^pick/edit/"},
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr  # stopped at `edit`, nothing in conflict
    err = rpc_error(daemon, "workspace.archive", {"workspace_id": ws["id"]})
    assert err.kind == "not_safe" and "a rebase is in progress" in err.message, err


def test_unmerged_paths_without_a_merge_are_named(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    """A `stash pop` that conflicts leaves unmerged entries and no MERGE_HEAD: git cannot
    write them as a tree; the refusal names them instead of git's `error building trees`."""
    ws = create(daemon, project["id"], "popped")["workspace"]
    path = Path(ws["path"])
    (path / "README.md").write_text("stashed\n")
    git(path, "stash", "-q")
    _commit(path, "README.md", "committed\n", "conflicting")
    git(path, "stash", "pop", check=False)
    err = rpc_error(daemon, "workspace.archive", {"workspace_id": ws["id"]})
    assert err.kind == "not_safe" and "README.md" in err.message, err
    assert err.data["files"] == ["README.md"]


def test_a_detached_head_no_ref_holds_is_kept_by_the_snapshot(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "detached")["workspace"]
    path = Path(ws["path"])
    git(path, "checkout", "-q", "--detach")
    lone = _commit(path, "lone.txt", "a commit only HEAD holds\n", "lone")
    assert git(path, "status", "--porcelain") == ""  # clean: nothing for git's view to save
    err = rpc_error(daemon, "workspace.remove", {"workspace_id": ws["id"]})
    assert err.kind == "not_safe" and "detached" in err.message, err
    before = disk(path)
    done = round_trip(daemon, ws)
    snap = done["archived"]["snapshot"]
    assert snap is not None
    assert git(repo, "rev-parse", f"{snap['commit']}^1").strip() == lone
    assert disk(path) == before  # its files, as they were, on the branch's checkout


def test_remove_with_force_snapshots_a_detached_head_no_ref_holds(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "detforce")["workspace"]
    path = Path(ws["path"])
    git(path, "checkout", "-q", "--detach")
    lone = _commit(path, "lone.txt", "only here\n", "lone")
    removed = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    assert removed["snapshot"] is not None
    assert git(repo, "rev-parse", f"{removed['snapshot']['commit']}^1").strip() == lone


def test_a_refusal_names_paths_never_a_git_warning(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    """git status warns on stderr about a directory it cannot open (here: beyond PATH_MAX);
    the refusal's files are paths, each one in the checkout."""
    ws = create(daemon, project["id"], "warned")["workspace"]
    path = Path(ws["path"])
    (path / "deep").mkdir()
    deep_dir(path / "deep", 4200)
    (path / "notes" / "a.txt").write_text("edited\n")
    err = rpc_error(daemon, "workspace.remove", {"workspace_id": ws["id"]})
    assert err.kind == "not_safe", err
    assert "notes/a.txt" in err.data["files"]
    for listed in err.data["files"]:
        assert not listed.startswith(("warning:", "error:", "fatal:")), listed
        assert "\n" not in listed, listed


def test_the_cli_says_what_was_kept_as_it_is_and_written_back(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "said")["workspace"]
    path = Path(ws["path"])
    nested_repo(path / "vendor" / "dep")
    archived = run_xum(daemon, "ws", "archive", "repo/said")
    assert archived.returncode == 0, archived.stderr
    assert "kept as they are beside the snapshot: vendor/dep (nested repository)" in (
        archived.stdout
    )
    restored = run_xum(daemon, "ws", "unarchive", "repo/said")
    assert restored.returncode == 0, restored.stderr
    assert "written back as they were kept: vendor/dep" in restored.stdout
    (path / "vendor" / "dep" / "more.txt").write_text("after the unarchive\n")
    removed = run_xum(daemon, "ws", "rm", "--force", "repo/said")
    assert removed.returncode == 0, removed.stderr
    assert "kept as they are in the kept copy: vendor/dep (nested repository)" in removed.stdout
