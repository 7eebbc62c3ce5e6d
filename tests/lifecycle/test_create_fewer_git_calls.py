"""Create's preparatory checks in fewer git processes: each folded check still
detects what the separate git calls did."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from xum_client.errors import XumRpcError
from xumd.lifecycle import bigrepo, create, materialise
from xumd.system.git import Git, GitError

from tests.support.daemon import DaemonProcess, short_tmpdir
from tests.support.gitrepo import git, make_repo

# Names the conservative rule must refuse (git refuses them all) and names it must accept
# (git accepts them all); the test below checks both sides against git itself.
REFUSED_BY_GIT = [
    "", "-x", "a..b", "a/.b", ".a", "a.", "a.lock", "a/b.lock", "a//b", "/a", "a/", "a b",
    "a~b", "a^b", "a:b", "a?b", "a*b", "a[b", "a\\b", "a@{b", "HEAD", "@{-1}",
]  # fmt: skip
PLAIN = ["main", "xum/ws-1", "feature/a_b.c", "a-", "A9/b/c", "x.y", "v1.2.3", "HEAD2", "a.lockx"]
# Valid for git, but outside the narrow rule: git decides them (the slow path).
GIT_ONLY = ["a+b", "caf\u00e9", "a@b", "a=b", "a,b"]


def _git_accepts(name: str) -> bool:
    done = subprocess.run(
        ["git", "check-ref-format", "--branch", name], capture_output=True, text=True, check=False
    )
    return done.returncode == 0 and done.stdout.strip() == name


def test_the_plain_rule_accepts_only_what_git_accepts() -> None:
    for name in PLAIN:
        assert create.plain_branch_name(name), name
        assert _git_accepts(name), name
    for name in REFUSED_BY_GIT:
        assert not create.plain_branch_name(name), name
        assert not _git_accepts(name), name
    for name in GIT_ONLY:
        assert not create.plain_branch_name(name), name
        assert _git_accepts(name), name


def test_resolve_answers_each_name_in_order() -> None:
    repo = make_repo(short_tmpdir() / "r", {"f": "x"})
    head = git(repo, "rev-parse", "HEAD").strip()
    blob = git(repo, "rev-parse", "HEAD:f").strip()
    git(repo, "tag", "-a", "-m", "t", "v1")
    git(repo, "branch", "main2")
    git(repo, "tag", "main2")  # an ambiguous name: git warns, the answer must not move
    names = ["refs/heads/main", "refs/heads/nope", "-h", "v1^{commit}", "HEAD:f", "HEAD:f^{commit}"]
    names += ["main2", "HEAD^{commit}"]
    found = anyio.run(lambda: Git().resolve(repo, *names))
    assert found == [head, None, None, head, blob, None, head, head]


def test_resolve_refuses_a_line_break_and_fails_outside_a_repository() -> None:
    repo = make_repo(short_tmpdir() / "r")
    with pytest.raises(ValueError, match="line break"):
        anyio.run(lambda: Git().resolve(repo, "a\nb"))
    with pytest.raises(GitError):
        anyio.run(lambda: Git().resolve(short_tmpdir(), "HEAD"))


def test_common_dir_and_the_branch_recheck_in_one_call() -> None:
    repo = make_repo(short_tmpdir() / "r")
    common = Path(git(repo, "rev-parse", "--path-format=absolute", "--git-common-dir").strip())
    ask = materialise._common_dir_and_branch
    assert anyio.run(lambda: ask(Git(), repo, "main")) == (common, True)
    assert anyio.run(lambda: ask(Git(), repo, "nope")) == (common, False)
    assert anyio.run(lambda: ask(Git(), repo, None)) == (common, False)
    with pytest.raises(GitError):
        anyio.run(lambda: ask(Git(), short_tmpdir(), "main"))


def test_sparse_is_looked_for_only_where_it_can_be(monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(short_tmpdir() / "r")
    assert not bigrepo._maybe_sparse(repo)
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "sparse-checkout").write_text("/*\n")
    assert bigrepo._maybe_sparse(repo)
    linked = repo.parent / "linked"
    git(repo, "worktree", "add", "-q", str(linked))
    assert bigrepo._maybe_sparse(linked)
    other = make_repo(short_tmpdir() / "o")
    monkeypatch.setenv("GIT_DIR", str(repo / ".git"))
    assert bigrepo._maybe_sparse(other)


@pytest.fixture(scope="module")
def daemon() -> Any:
    root = short_tmpdir() / "root"
    d = DaemonProcess(root).start()
    yield d
    d.terminate()


def _project(daemon: DaemonProcess, files: dict[str, str] | None = None) -> tuple[Path, str]:
    repo = make_repo(short_tmpdir() / "repo", files)
    added = daemon.call("project.add", {"path": str(repo), "name": repo.parent.name})
    return repo, added["project"]["id"]


def _refused(daemon: DaemonProcess, params: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(XumRpcError) as caught:
        daemon.call("workspace.create", params)
    return {"kind": caught.value.kind, "message": str(caught.value)}


def test_each_condition_the_folded_checks_replaced_is_still_refused(
    daemon: DaemonProcess,
) -> None:
    repo, project = _project(daemon)
    head = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "branch", "taken")
    # A missing base, an option-like base, a base that is not a commit.
    for base in ("nope", "-h", "HEAD:README.md"):
        got = _refused(daemon, {"project_id": project, "name": "w1", "base": base})
        assert got["kind"] == "not_found", (base, got)
    # An existing branch with a base: a conflict; without: it is checked out, not made.
    got = _refused(daemon, {"project_id": project, "name": "w2", "branch": "taken", "base": "HEAD"})
    assert got["kind"] == "conflict"
    made = daemon.call("workspace.create", {"project_id": project, "name": "w3", "branch": "taken"})
    assert made["base_commit"] == head
    # Invalid names (git decides them) and one only git accepts.
    for branch in ("a..b", "@{-1}", "-x", "HEAD", "a.lock"):
        got = _refused(daemon, {"project_id": project, "name": "w4", "branch": branch})
        assert got["kind"] == "invalid_name", (branch, got)
    made = daemon.call("workspace.create", {"project_id": project, "name": "w5", "branch": "a+b"})
    assert git(Path(made["workspace"]["path"]), "branch", "--show-current").strip() == "a+b"


def test_a_detached_or_unborn_head(daemon: DaemonProcess) -> None:
    repo, project = _project(daemon)
    head = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "checkout", "-q", "--detach")
    made = daemon.call("workspace.create", {"project_id": project, "name": "d"})
    assert made["base_commit"] == head
    empty = short_tmpdir() / "empty"
    empty.mkdir()
    git(empty, "init", "-q", "-b", "main")
    project2 = daemon.call("project.add", {"path": str(empty), "name": "empty"})["project"]["id"]
    got = _refused(daemon, {"project_id": project2, "name": "u"})
    assert got["kind"] == "not_found"


def test_sparse_config_without_a_sparse_file_is_a_full_checkout(daemon: DaemonProcess) -> None:
    """`core.sparseCheckout` set but no `info/sparse-checkout`: git treats the checkout as
    full (`sparse-checkout list` only warns, which was taken for a pattern before)."""
    repo, project = _project(daemon, {"a/x": "1", "b/y": "2"})
    git(repo, "config", "core.sparseCheckout", "true")
    git(repo, "config", "core.sparseCheckoutCone", "true")
    made = daemon.call("workspace.create", {"project_id": project, "name": "s"})
    assert made.get("sparse") is None
    path = Path(made["workspace"]["path"])
    assert (path / "a" / "x").is_file()
    assert (path / "b" / "y").is_file()
    assert os.path.isfile(path / ".git")
