"""The warm pool (`[create] pool`): real repositories, a real daemon. A claimed checkout equals a
fresh one; a miss and a stale entry fall back to a fresh checkout and say so; entries are refilled
in the background, never listed as workspaces, counted by `workspace.usage`."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, run_xum, write_config
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import add_project, create, worktrees
from tests.support.wait import until

FILES = {"README.md": "hi\n", "src/a.txt": "a\n", "src/deep/b.txt": "b\n", ".gitignore": "*.log\n"}


def entries(root: Path, state: str | None = None) -> list[dict[str, Any]]:
    db = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        found = db.execute("SELECT * FROM pool_entries ORDER BY created_at").fetchall()
    finally:
        db.close()
    return [dict(r) for r in found if state is None or r["state"] == state]


def ready(root: Path, count: int = 1) -> list[dict[str, Any]]:
    return until(
        lambda: (found := entries(root, "ready")) and len(found) >= count and found,
        message=f"{count} ready pool entries",
    )


@pytest.fixture
def pooled(tmp_short: Path) -> Any:
    repo = make_repo(tmp_short / "repo", FILES)
    root = tmp_short / "root"
    write_config(root, "[create]\npool = 1\n")
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        yield daemon, root, repo, project
    finally:
        daemon.close()


def checkout_view(path: Path) -> dict[str, Any]:
    files = sorted(
        str(p.relative_to(path)) for p in path.rglob("*") if ".git" not in p.relative_to(path).parts
    )
    return {
        "files": files,
        "content": {f: (path / f).read_bytes() for f in files if (path / f).is_file()},
        "head": git(path, "rev-parse", "HEAD").strip(),
        "branch": git(path, "symbolic-ref", "HEAD").strip().rsplit("/", 1)[-1],
        "status": git(path, "status", "--porcelain=v1", "--untracked-files=all"),
    }


def test_a_hit_equals_a_fresh_checkout(pooled: Any, tmp_short: Path) -> None:
    daemon, root, repo, project = pooled
    entry = ready(root)[0]
    hit = create(daemon, project["id"], "w1", branch="b")
    assert (hit["pool"], hit["materialised"]) == ("hit", "pool")
    assert entries(root, "claiming") == []
    assert all(e["id"] != entry["id"] for e in entries(root))  # the workspace took it over
    path = Path(hit["workspace"]["path"])
    assert not Path(entry["path"]).exists()
    # The same create on a root without a pool: a fresh checkout to compare with.
    plain_root = tmp_short / "plain"
    plain = DaemonProcess(plain_root).start()
    try:
        other = make_repo(tmp_short / "repo2", FILES)
        fresh = create(plain, add_project(plain, other)["id"], "w1", branch="b")
        assert (fresh["pool"], fresh["materialised"]) == (None, "git")
        a, b = checkout_view(path), checkout_view(Path(fresh["workspace"]["path"]))
        assert a["files"] == b["files"] and a["content"] == b["content"]
        assert a["branch"] == b["branch"] == "b"
        assert a["status"] == b["status"] == ""
    finally:
        plain.close()
    assert a["head"] == hit["base_commit"] == git(repo, "rev-parse", "HEAD").strip()
    # git's view: the worktree is registered at the workspace's path, locked with its marker.
    listed = worktrees(repo)[str(path)]
    assert listed["branch"] == "refs/heads/b"
    assert listed["locked"] == f"xum {hit['workspace']['id']} {hit['workspace']['incarnation']}"
    assert git(repo, "worktree", "prune", "--dry-run", "-v").strip() == ""


def test_a_refill_follows_a_claim_and_entries_are_never_listed(pooled: Any) -> None:
    daemon, root, _repo, project = pooled
    first = ready(root)[0]
    assert create(daemon, project["id"], "w1")["pool"] == "hit"
    refilled = ready(root)[0]
    assert refilled["id"] != first["id"]
    listed = daemon.call("workspace.list", {})["workspaces"]
    assert [w["name"] for w in listed] == ["w1"]
    usage = daemon.call("workspace.usage", {})
    assert [w["name"] for w in usage["workspaces"]] == ["w1"]
    assert usage["root"]["pool_entries"] == 1
    assert usage["root"]["pool_bytes"] > 0
    assert (
        usage["root"]["total_bytes"]
        >= usage["root"]["pool_bytes"] + usage["root"]["workspaces_bytes"]
    )
    # `xum ws new` says what the pool gave and how the checkout was made.
    made = run_xum(daemon, "ws", "new", project["id"], "w2")
    assert made.returncode == 0, made.stderr
    assert "pool: hit (checkout: pool)" in made.stdout.splitlines()


def test_an_empty_pool_is_a_miss_and_no_pool_is_null(tmp_short: Path) -> None:
    repo = make_repo(tmp_short / "repo", FILES)
    root = tmp_short / "root"
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        made = create(daemon, project["id"], "w0")
        assert made["pool"] is None
        # The project's own `[create] pool`: the first create finds the pool empty (a miss),
        # and wakes its refill.
        (repo / ".xum").mkdir()
        (repo / ".xum" / "config.toml").write_text("[create]\npool = 1\n")
        missed = create(daemon, project["id"], "w1")
        assert (missed["pool"], missed["materialised"]) == ("miss", "git")
        ready(root)
        # An existing branch is never a pool entry's checkout: a miss, the entry left.
        git(repo, "branch", "existing")
        assert create(daemon, project["id"], "w2", branch="existing")["pool"] == "miss"
        assert len(entries(root, "ready")) == 1  # left for the next create
    finally:
        daemon.close()


def test_a_moved_base_makes_the_entry_stale_and_it_is_rebuilt(pooled: Any) -> None:
    daemon, root, repo, project = pooled
    old = ready(root)[0]
    (repo / "new.txt").write_text("new\n")
    git(repo, "add", "new.txt")
    git(repo, "commit", "-q", "-m", "moved")
    made = create(daemon, project["id"], "w1")
    assert (made["pool"], made["materialised"]) == ("stale", "git")
    path = Path(made["workspace"]["path"])
    assert (path / "new.txt").read_text() == "new\n"  # the fresh checkout, at the new base
    new_head = git(repo, "rev-parse", "HEAD").strip()
    # The create woke the refill: the old entry is dropped, one at the new base takes its place.
    until(
        lambda: (
            [e["base_commit"] for e in entries(root)] == [new_head]
            and entries(root)[0]["state"] == "ready"
        ),
        message="the pool rebuilt at the new base",
    )
    assert not Path(old["path"]).exists()
    assert str(Path(old["path"])) not in worktrees(repo)
    assert create(daemon, project["id"], "w2")["pool"] == "hit"


@pytest.mark.parametrize(
    ("rel", "content"),
    [
        ("scratch.txt", "an untracked file at the top\n"),
        ("src/deep/new/x.txt", "an untracked file in a new directory deep down\n"),
        ("src/deep/b.txt", "b, edited in place\n"),
    ],
)
def test_an_entry_dirtied_by_hand_is_never_claimed(pooled: Any, rel: str, content: str) -> None:
    daemon, root, _repo, project = pooled
    entry = ready(root)[0]
    target = Path(entry["path"]) / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    made = create(daemon, project["id"], "w1")
    assert (made["pool"], made["materialised"]) == ("stale", "git")
    path = Path(made["workspace"]["path"])
    assert not (path / rel).exists() or (path / rel).read_text() != content
    assert git(path, "status", "--porcelain=v1", "--untracked-files=all") == ""
    until(
        lambda: all(e["id"] != entry["id"] for e in entries(root)),
        message="the dirty entry dropped",
    )


def test_an_entry_made_before_a_restart_is_claimed_after_a_full_status(pooled: Any) -> None:
    daemon, root, _repo, project = pooled
    entry = ready(root)[0]
    daemon.close()
    again = DaemonProcess(root).start()
    try:
        assert [e["id"] for e in entries(root, "ready")] == [entry["id"]]
        made = create(again, project["id"], "w1")
        assert made["pool"] == "hit"
        assert Path(made["workspace"]["path"]).is_dir() and not Path(entry["path"]).exists()
    finally:
        again.close()


def test_a_restart_keeps_ready_entries_and_drops_a_half_made_one(pooled: Any) -> None:
    daemon, root, repo, _project = pooled
    entry = ready(root)[0]
    daemon.close()
    db = sqlite3.connect(root / "state.db")
    with db:
        db.execute("UPDATE pool_entries SET state = 'preparing' WHERE id = ?", (entry["id"],))
    db.close()
    again = DaemonProcess(root).start()
    try:
        # The half-made entry (by its row) was dropped at start-up, before readiness.
        assert all(e["id"] != entry["id"] for e in entries(root))
        assert not Path(entry["path"]).exists()
        assert str(Path(entry["path"])) not in worktrees(repo)
        ready(root)  # and the pool is made up again
    finally:
        again.close()


def test_gc_collects_entries_beyond_the_size(tmp_short: Path) -> None:
    repo = make_repo(tmp_short / "repo", {**FILES, ".xum/config.toml": "[create]\npool = 2\n"})
    root = tmp_short / "root"
    daemon = DaemonProcess(root).start()
    try:
        add_project(daemon, repo)
        two = ready(root, 2)
        (repo / ".xum" / "config.toml").write_text("[create]\npool = 1\n")
        plan = daemon.call("gc.plan", {})
        items = [i for i in plan["items"] if i["action"] == "drop_pool_entry"]
        assert [i["key"] for i in items] == [f"drop_pool_entry:{two[1]['id']}"]  # the newest
        assert items[0]["bytes"] > 0
        done = daemon.call("gc.run", {"keys": [items[0]["key"]]})
        assert [d["key"] for d in done["done"]] == [items[0]["key"]]
        assert [e["id"] for e in entries(root)] == [two[0]["id"]]
        assert not Path(two[1]["path"]).exists()
        assert str(Path(two[1]["path"])) not in worktrees(repo)
        assert daemon.call("workspace.strays", {})["strays"] == []
    finally:
        daemon.close()


def test_a_hit_applies_the_cone_and_submodules_as_a_fresh_create(tmp_short: Path) -> None:
    sub = make_repo(tmp_short / "sub", {"s.txt": "s\n"})
    repo = make_repo(tmp_short / "repo", {**FILES, "other/o.txt": "o\n"})
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "sub")
    git(repo, "commit", "-q", "-m", "submodule")
    git(repo, "sparse-checkout", "set", "--cone", "--skip-checks", "src", "sub")
    root = tmp_short / "root"
    write_config(root, "[create]\npool = 1\n")
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        entry = ready(root)[0]
        assert entry["sparse"] is not None
        made = create(daemon, project["id"], "w1")
        assert made["pool"] == "hit"
        path = Path(made["workspace"]["path"])
        assert made["sparse"]["patterns"] == ["src", "sub"]
        assert (path / "src" / "a.txt").is_file() and not (path / "other").exists()
        assert [(s["path"], s["status"]) for s in made["submodules"]] == [("sub", "initialized")]
        assert (path / "sub" / "s.txt").read_text() == "s\n"
        assert git(path / "sub", "status", "--porcelain") == ""
        assert git(path, "status", "--porcelain=v1", "--untracked-files=all") == ""
    finally:
        daemon.close()


def test_removing_the_project_drops_its_entries(pooled: Any) -> None:
    daemon, root, repo, project = pooled
    entry = ready(root)[0]
    daemon.call("project.remove", {"project_id": project["id"]})
    until(lambda: not entries(root), message="the removed project's entries dropped")
    assert not Path(entry["path"]).exists()
    assert list(worktrees(repo)) == [str(repo)]  # git's admin entry went with it
