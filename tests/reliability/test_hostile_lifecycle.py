"""Hostile input to the lifecycle: names and refs that try to escape or become options, a project
path that is a symlink to `/`, symlinks out of a checkout, a checkout replaced by a symlink before
removal, a `.git` file pointing at another repository, a teardown that escapes its process group,
and scripts of an untrusted config. Held: a clear error or a correct result, nothing
half-applied, nothing outside the daemon's own places touched."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xum_client.errors import XumClientError

from tests.reliability.budget import size
from tests.reliability.lifecycle_support import (
    check_invariants,
    rows,
    small_repo,
    wait_cleanup_idle,
    worktrees,
)
from tests.support.daemon import DaemonProcess, short_tmpdir
from tests.support.gitrepo import git
from tests.support.wait import until

pytestmark = pytest.mark.reliability


def _kind(exc: BaseException) -> str:
    return str(getattr(exc, "kind", "") or getattr(exc, "data", {}).get("kind", ""))


def _call(daemon: DaemonProcess, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return daemon.call(method, params)


def _error(daemon: DaemonProcess, method: str, params: dict[str, Any]) -> XumClientError:
    with pytest.raises(XumClientError) as info:
        daemon.call(method, params)
    return info.value


def _tree_digest(path: Path) -> str:
    """Names, link targets and contents under `path` (not following links; .git excluded: git's
    own bookkeeping is checked separately)."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(Path(dirpath, d))]):
            full = Path(dirpath, name)
            digest.update(str(full.relative_to(path)).encode())
            if full.is_symlink():
                digest.update(b"->" + os.readlink(full).encode())
            else:
                digest.update(full.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[DaemonProcess, Path, str, Path]]:
    """One daemon and one project for the name/ref cases (they create little)."""
    tmp = short_tmpdir("xumh-")
    daemon = DaemonProcess(tmp / "root", log_level="info").start()
    repo = small_repo(tmp / "repo")
    project = daemon.call("project.add", {"path": str(repo)})["project"]["id"]
    yield daemon, repo, project, tmp
    daemon.close()
    shutil.rmtree(tmp, ignore_errors=True)


HOSTILE_NAMES = [
    "..",
    "../escape",
    "a/../../b",
    "a/b",
    "/abs",
    "-rf",
    "--force",
    ".hidden",
    "nul\0byte",
    "bell\x07",
    "new\nline",
    "tab\tname",
    "esc\x1b[31m",
    "del\x7f",
    "a" * 65,
    "",
    " ",
    "é",
    "a..b",
    "x" * 300,
]


def _snapshot_state(daemon: DaemonProcess, repo: Path) -> tuple[Any, ...]:
    branches = git(repo, "for-each-ref", "--format=%(refname)", "refs/heads")
    return (
        sorted((r["name"], r["state"]) for r in rows(daemon.root)),
        sorted(worktrees(repo).items()),
        branches,
        sorted(os.listdir(daemon.root / "workspaces"))
        if (daemon.root / "workspaces").exists()
        else [],
    )


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_workspace_names_are_refused_cleanly(
    world: tuple[DaemonProcess, Path, str, Path], name: str
) -> None:
    daemon, repo, project, _ = world
    before = _snapshot_state(daemon, repo)
    for runtime in ("worktree", "directory"):
        error = _error(
            daemon, "workspace.create", {"project_id": project, "name": name, "runtime": runtime}
        )
        assert _kind(error) in {"invalid_name", "invalid_params"}, (name, error)
    assert _snapshot_state(daemon, repo) == before, "a refused create left something behind"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("branch", "--force"),
        ("branch", "-D"),
        ("branch", "../../x"),
        ("branch", "a..b"),
        ("branch", "refs/heads/../../x"),
        ("branch", "x\0y"),
        ("branch", "bell\x07"),
        ("branch", "@{-1}"),
        ("branch", "has space"),
        ("branch", "x.lock"),
        ("base", "--upload-pack=touch /tmp/xum-pwned"),
        ("base", "-h"),
        ("base", "HEAD; touch /tmp/xum-pwned"),
        ("base", "$(touch /tmp/xum-pwned)"),
        ("base", "no-such-commit"),
    ],
)
def test_hostile_branch_and_base_are_never_options(
    world: tuple[DaemonProcess, Path, str, Path], field: str, value: str
) -> None:
    daemon, repo, project, _ = world
    before = _snapshot_state(daemon, repo)
    try:
        created = daemon.call(
            "workspace.create", {"project_id": project, "name": "refcase", field: value}
        )
    except XumClientError as exc:
        assert _kind(exc) in {"invalid_name", "invalid_params", "not_found", "operation_failed"}
        assert _snapshot_state(daemon, repo) == before, "a refused create left something behind"
    else:
        # Accepted: then it was taken literally, as a branch name, never as an option.
        ws = created["workspace"]
        assert ws["branch"] == value or field == "base"
        daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
        if ws["branch"]:
            git(repo, "branch", "-D", "--", ws["branch"])
    assert not Path("/tmp/xum-pwned").exists(), "a ref was run as a command or an option"


@settings(
    max_examples=size(60, 15),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(name=st.text(max_size=70))
def test_any_name_is_created_inside_or_refused(
    world: tuple[DaemonProcess, Path, str, Path], name: str
) -> None:
    daemon, _repo, project, _ = world
    try:
        created = daemon.call(
            "workspace.create", {"project_id": project, "name": name, "runtime": "directory"}
        )
    except XumClientError as exc:
        assert _kind(exc) in {"invalid_name", "invalid_params", "conflict"}, (name, exc)
        return
    ws = created["workspace"]
    path = Path(ws["path"])
    workspaces = (daemon.root / "workspaces").resolve()
    assert path.resolve().parent.parent == workspaces, f"{name!r} escaped to {path}"
    daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})


def test_project_path_symlink_to_root(tmp_short: Path, daemon: DaemonProcess) -> None:
    link = tmp_short / "slash"
    link.symlink_to("/")
    for params in ({"path": str(link)}, {"path": str(link), "name": "slash"}):
        try:
            project = daemon.call("project.add", params)["project"]
        except XumClientError as exc:
            assert _kind(exc) in {"invalid_path", "invalid_name"}, exc
            continue
        # Accepted as a plain directory: its workspaces still live under the daemon's root.
        assert project["path"] == "/"
        ws = daemon.call(
            "workspace.create",
            {"project_id": project["id"], "name": "w", "runtime": "directory"},
        )["workspace"]
        assert Path(ws["path"]).is_relative_to(daemon.root), ws["path"]
        daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
        assert Path("/etc/passwd").exists() and Path("/usr").is_dir()


def _project(daemon: DaemonProcess, repo: Path) -> str:
    return str(daemon.call("project.add", {"path": str(repo)})["project"]["id"])


@pytest.mark.parametrize("op", ["archive", "remove"])
def test_symlinks_out_of_the_checkout_are_not_followed(
    tmp_short: Path, daemon: DaemonProcess, op: str
) -> None:
    outside = tmp_short / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "precious.txt").write_text("do not delete\n")
    (outside / "deep" / "more.txt").write_text("nor this\n")
    before = _tree_digest(outside)
    repo = small_repo(tmp_short / "repo")
    project = _project(daemon, repo)
    ws = daemon.call("workspace.create", {"project_id": project, "name": "w"})["workspace"]
    checkout = Path(ws["path"])
    (checkout / "escape").symlink_to(outside)  # untracked symlink to a directory
    (checkout / "src" / "rel").symlink_to(os.path.relpath(outside, checkout / "src"))
    (checkout / "node_modules").mkdir()  # ignored? (not by this repo's .gitignore)
    (checkout / "node_modules" / "link").symlink_to(outside / "deep")
    if op == "archive":
        daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    else:
        daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    wait_cleanup_idle(daemon.root)
    assert _tree_digest(outside) == before, "a symlink out of the checkout was followed"
    assert not checkout.exists()
    if op == "archive":
        restored = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})["workspace"]
        assert os.readlink(Path(restored["path"]) / "escape") == str(outside)


@pytest.mark.parametrize("op", ["archive", "remove"])
def test_checkout_replaced_by_a_symlink_is_not_followed(
    tmp_short: Path, daemon: DaemonProcess, op: str
) -> None:
    victim = small_repo(tmp_short / "victim", files=10)  # someone else's repository
    (victim / "untracked-work.txt").write_text("unsaved work of someone else\n")
    before = _tree_digest(victim)
    repo = small_repo(tmp_short / "repo")
    project = _project(daemon, repo)
    ws = daemon.call("workspace.create", {"project_id": project, "name": "w"})["workspace"]
    checkout = Path(ws["path"])
    moved = tmp_short / "moved-away"
    checkout.rename(moved)
    checkout.symlink_to(victim)
    try:
        if op == "archive":
            daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        else:
            daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    except XumClientError as exc:
        assert _kind(exc) in {"conflict", "not_safe", "operation_failed", "invalid_state"}, exc
    wait_cleanup_idle(daemon.root)
    assert _tree_digest(victim) == before, "the daemon followed a symlink into another tree"
    assert git(victim, "status", "--porcelain").strip() == "?? untracked-work.txt"
    assert daemon.call("daemon.status")["pid"] == daemon.pid


def test_git_file_pointing_at_another_repository(tmp_short: Path, daemon: DaemonProcess) -> None:
    """A directory whose `.git` file points at another repository: whatever the daemon does
    through it, the other repository's working tree and its own worktrees are left alone."""
    other = small_repo(tmp_short / "other", files=10)
    (other / "uncommitted.txt").write_text("the other repository's own work\n")
    before = _tree_digest(other)
    fake = tmp_short / "fake"
    fake.mkdir()
    (fake / ".git").write_text(f"gitdir: {other / '.git'}\n")
    try:
        project = _project(daemon, fake)
    except XumClientError as exc:
        assert _kind(exc) in {"invalid_path", "conflict"}, exc
        return
    try:
        ws = daemon.call("workspace.create", {"project_id": project, "name": "w"})["workspace"]
    except XumClientError as exc:
        assert _kind(exc) in {"invalid_path", "operation_failed", "invalid_params"}, exc
    else:
        daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
        wait_cleanup_idle(daemon.root)
    assert _tree_digest(other) == before, "the other repository's checkout was touched"
    assert worktrees(other) == {}, "a worktree was left in the other repository"


def test_one_repository_is_one_project(tmp_short: Path, daemon: DaemonProcess) -> None:
    other = small_repo(tmp_short / "other", files=10)
    fake = tmp_short / "fake"
    fake.mkdir()
    (fake / ".git").write_text(f"gitdir: {other / '.git'}\n")
    _project(daemon, fake)
    error = _error(daemon, "project.add", {"path": str(other)})
    assert _kind(error) == "conflict"


def _trusted_project(daemon: DaemonProcess, repo: Path, config: str) -> str:
    (repo / ".xum").mkdir()
    (repo / ".xum" / "config.toml").write_text(config)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "config")
    project = _project(daemon, repo)
    daemon.call("project.trust", {"project_id": project})
    return project


def test_untrusted_scripts_never_run(tmp_short: Path, daemon: DaemonProcess) -> None:
    marker = tmp_short / "ran"
    repo = small_repo(tmp_short / "repo")
    (repo / ".xum").mkdir()
    (repo / ".xum" / "config.toml").write_text(
        f'[scripts]\nsetup = ["touch {marker}-setup"]\nteardown = ["touch {marker}-teardown"]\n'
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "config")
    project = _project(daemon, repo)
    created = daemon.call("workspace.create", {"project_id": project, "name": "w"})
    assert created["setup"]["status"] == "untrusted"
    removed = daemon.call(
        "workspace.remove", {"workspace_id": created["workspace"]["id"], "force": True}
    )
    # The teardown cannot run untrusted; since setup never ran either, nothing of it is owed:
    # the checkout goes and the result says the teardown was skipped (a teardown owed by a
    # trusted setup blocks instead: tests/cleanup/test_end_to_end.py).
    assert removed["cleanup"]["status"] == "completed", removed["cleanup"]
    assert not Path(created["workspace"]["path"]).exists()
    assert not Path(f"{marker}-setup").exists()
    assert not Path(f"{marker}-teardown").exists()
    # Trusted: it runs. Changed afterwards: untrusted again, and nothing of the change runs.
    daemon.call("project.trust", {"project_id": project})
    checkout = daemon.call("workspace.create", {"project_id": project, "name": "v"})
    assert checkout["setup"]["status"] == "ok"
    assert Path(f"{marker}-setup").exists()
    evil = tmp_short / "evil"
    (repo / ".xum" / "config.toml").write_text(f'[scripts]\nsetup = ["touch {evil}"]\n')
    git(repo, "commit", "-q", "-am", "changed config")  # the checkout carries the new content
    again = daemon.call("workspace.create", {"project_id": project, "name": "u"})
    assert again["setup"]["status"] == "untrusted"
    assert not evil.exists()


def _sleepers(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if token in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


def test_teardown_that_escapes_its_group(tmp_short: Path, daemon: DaemonProcess) -> None:
    """A teardown leaving a background child in its group, and a double-forked, setsid child.
    Both are stopped before the cleanup completes: the group member by the group kill, the
    escapee by its marker (xumd.system.containment; see docs/RELIABILITY.md)."""
    token_group = "4242.25"
    token_escape = "4242.75"
    config = (
        "[scripts]\n"
        f'teardown = ["sleep {token_group} & (setsid sleep {token_escape} &) ; echo done"]\n'
    )
    repo = small_repo(tmp_short / "repo")
    project = _trusted_project(daemon, repo, config)
    ws = daemon.call("workspace.create", {"project_id": project, "name": "w"})["workspace"]
    daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    wait_cleanup_idle(daemon.root)
    try:
        until(lambda: not _sleepers(token_group), 15, message="in-group child killed")
        # Stopped before the remove answered (zombies aside, which the daemon reaps).
        assert not [p for p in _sleepers(token_escape) if p.status() != psutil.STATUS_ZOMBIE]
        until(lambda: not _sleepers(token_escape), 15, message="escapee reaped")
    finally:
        for proc in _sleepers(token_escape) + _sleepers(token_group):
            proc.kill()  # only the sleepers this test made the daemon start
    assert check_invariants(daemon.root, {project: repo}) == []
