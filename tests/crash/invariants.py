"""The invariants checked after every crash + restart, from outside the daemon: git's own
view of the repository, the filesystem, and ordinary RPC calls."""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.crash.world import World
from tests.support.gitrepo import git

TRANSITIONAL = ("archiving", "restoring", "removing")


@dataclass
class Before:
    """What existed before the operation: branches, and uncommitted files per workspace."""

    branches: set[str] = field(default_factory=set)
    dirty: dict[str, dict[str, str]] = field(default_factory=dict)
    renamed: dict[str, str] = field(default_factory=dict)
    """Branch renames the operation may have made (old -> new): either name is fine."""


def branches(repo: Path) -> set[str]:
    return set(git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").split())


def git_worktrees(repo: Path) -> list[str]:
    paths = []
    for line in git(repo, "worktree", "list", "--porcelain").splitlines():
        if line.startswith("worktree "):
            paths.append(line[len("worktree ") :])
    return [p for p in paths if os.path.realpath(p) != os.path.realpath(repo)]


def snapshot_file(repo: Path, workspace_id: str, rel: str) -> list[str]:
    """The contents of `rel` in every snapshot ref of the workspace."""
    refs = git(
        repo, "for-each-ref", "--format=%(refname)", f"refs/xum/snapshots/{workspace_id}/"
    ).split()
    found = []
    for ref in refs:
        text = git(repo, "show", f"{ref}:{rel}", check=False)
        found.append(text)
    return found


def pool_rows(world: World) -> list[dict[str, Any]]:
    """The warm pool's entry rows (read-only: the daemon owns the store)."""
    db = sqlite3.connect(f"file:{world.root / 'state.db'}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in db.execute("SELECT * FROM pool_entries")]
    finally:
        db.close()


def claimed_paths(world: World) -> set[str]:
    claimed = {os.path.realpath(w["path"]) for w in world.workspaces()}
    claimed |= {os.path.realpath(e["path"]) for e in pool_rows(world)}
    for ob in world.call("cleanup.list", {"limit": 10_000})["obligations"]:
        if ob["state"] in ("pending", "failed"):
            claimed.add(os.path.realpath(ob["path"]))
    return claimed


def check(world: World, before: Before, *, where: str) -> list[str]:
    """Every problem found (empty: all invariants hold)."""
    problems: list[str] = []
    rows = world.workspaces()
    by_id = {w["id"]: w for w in rows}
    claimed = claimed_paths(world)

    # 1. No checkout or git worktree without a row (or an unfinished cleanup step). The warm
    # pool works in the background: its rows are read again after git's list, so an entry
    # made meanwhile (its row is committed before its worktree) or dropped meanwhile (its row
    # goes after its worktree) is seen with its row in one read or the other.
    worktrees = git_worktrees(world.repo)
    claimed |= {os.path.realpath(e["path"]) for e in pool_rows(world)}
    for path in worktrees:
        if os.path.realpath(path) not in claimed:
            problems.append(f"git worktree {path} has no row")
    workspaces_dir = world.root / "workspaces"
    if workspaces_dir.is_dir():
        for project_dir in workspaces_dir.iterdir():
            for entry in project_dir.iterdir() if project_dir.is_dir() else []:
                if entry.name.startswith("."):
                    continue
                if os.path.realpath(entry) not in claimed:
                    problems.append(f"checkout {entry} has no row")
    problems += _pool_problems(world)
    strays = world.call("workspace.strays", {})["strays"]
    if strays:
        problems.append(f"workspace.strays lists {[s['path'] for s in strays]}")

    # 2. Every `creating` row is active or interrupted; no half-done structural state.
    for w in rows:
        if w["state"] == "creating" and not w["interrupted"]:
            problems.append(f"{w['name']} is creating and not flagged interrupted")
        if w["state"] in TRANSITIONAL:
            problems.append(f"{w['name']} stayed {w['state']} after recovery")

    # 3. Uncommitted files: on disk in the workspace, or in one of its snapshot refs.
    for wid, files in before.dirty.items():
        row = by_id.get(wid)
        for rel, content in files.items():
            on_disk = None
            if row is not None:
                try:
                    on_disk = (Path(row["path"]) / rel).read_text()
                except OSError:
                    on_disk = None
            if on_disk == content:
                continue
            if content in snapshot_file(world.repo, wid, rel):
                continue
            problems.append(f"{rel} of {wid} is neither on disk nor in a snapshot ({where})")

    # 4. Branches kept (a rename may have moved one).
    now = branches(world.repo)
    for branch in before.branches - now:
        if before.renamed.get(branch) not in now:
            problems.append(f"branch {branch} was lost")

    # 5. No obligation lost: an archived row's checkout is gone or has a pending step.
    for w in rows:
        if (
            w["state"] == "archived"
            and os.path.lexists(w["path"])
            and os.path.realpath(w["path"]) not in claimed_paths_obligations(world)
        ):
            problems.append(f"archived {w['name']} still has a checkout and no cleanup step")
    return [f"[{where}] {p}" for p in problems]


def _pool_problems(world: World) -> list[str]:
    """Every warm pool checkout has its entry row, and no claim is left mid-way."""
    problems = []
    entries = pool_rows(world)
    known = {os.path.realpath(e["path"]) for e in entries}
    for pool_dir in (world.root / "workspaces").glob("*/.xum-pool"):
        for entry in pool_dir.iterdir():
            if os.path.realpath(entry) not in known:
                problems.append(f"pool checkout {entry} has no entry row")
    problems += [
        f"pool entry {e['id']} stayed claiming" for e in entries if e["state"] == "claiming"
    ]
    return problems


def claimed_paths_obligations(world: World) -> set[str]:
    return {
        os.path.realpath(ob["path"])
        for ob in world.call("cleanup.list", {"limit": 10_000})["obligations"]
        if ob["state"] in ("pending", "failed")
    }


def resolve(world: World) -> dict[str, Any]:
    """What a user does after a crash, with ordinary calls only: keep an interrupted workspace
    whose checkout is there, remove (confirmed, force) one whose checkout is not."""
    done: dict[str, Any] = {}
    for w in world.workspaces():
        if not w["interrupted"]:
            continue
        kept = world.try_call("workspace.keep", {"workspace_id": w["id"]})
        if isinstance(kept, dict):
            done[w["id"]] = "kept"
            continue
        removed = world.try_call("workspace.remove", {"workspace_id": w["id"], "force": True})
        assert isinstance(removed, dict), f"neither keep nor remove resolves {w}: {removed}"
        done[w["id"]] = "removed"
    return done
