"""Helpers for the lifecycle reliability tests: an asyncio client, repositories, and the final
invariant check (git's view of each repository matches the daemon's rows)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from bench.client import Conn, RpcError
from tests.support.gitrepo import git, make_repo

__all__ = ["Conn", "RpcError", "check_invariants", "small_repo", "wait_cleanup_idle"]


def small_repo(path: Path, files: int = 40) -> Path:
    return make_repo(path, {f"src/m{i % 5}/f{i}.txt": f"line {i}\n" * 3 for i in range(files)})


def rows(root: Path) -> list[dict[str, Any]]:
    db = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in db.execute("SELECT * FROM workspaces")]
    finally:
        db.close()


def pending_obligations(root: Path) -> list[dict[str, Any]]:
    db = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        return [
            dict(r) for r in db.execute("SELECT * FROM cleanup_obligations WHERE state='pending'")
        ]
    finally:
        db.close()


def wait_cleanup_idle(root: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while pending_obligations(root):
        if time.monotonic() > deadline:
            raise AssertionError(f"obligations still pending: {pending_obligations(root)[:3]}")
        time.sleep(0.05)


def worktrees(repo: Path) -> dict[str, str]:
    """Linked worktrees of `repo`: path -> branch (git's view)."""
    found: dict[str, str] = {}
    path = ""
    for line in git(repo, "worktree", "list", "--porcelain").splitlines():
        if line.startswith("worktree "):
            path = line.split(" ", 1)[1]
        elif line.startswith("branch ") and path:
            found[path] = line.split(" ", 1)[1].removeprefix("refs/heads/")
    found.pop(str(repo), None)
    found.pop(str(repo.resolve()), None)
    return found


def check_invariants(root: Path, repos: dict[str, Path]) -> list[str]:
    """Problems found: rows in a transitional state, worktrees without a row or rows without
    their worktree, archived rows whose branch or snapshot ref is gone. Empty means it holds."""
    problems: list[str] = []
    by_project: dict[str, list[dict[str, Any]]] = {}
    for row in rows(root):
        by_project.setdefault(row["project_id"], []).append(row)
        if row["state"] not in ("active", "archived"):
            problems.append(f"{row['id']} left in state {row['state']}")
    for project_id, repo in repos.items():
        trees = worktrees(repo)
        mine = by_project.get(project_id, [])
        active = {
            r["path"]: r for r in mine if r["state"] == "active" and r["runtime"] == "worktree"
        }
        for path in trees.keys() - active.keys():
            problems.append(f"{repo}: worktree {path} has no active row")
        for path, row in active.items():
            if path not in trees:
                problems.append(f"{row['id']}: active row but git has no worktree at {path}")
            elif row["branch"] and trees[path] != row["branch"]:
                problems.append(f"{row['id']}: row branch {row['branch']}, git {trees[path]}")
            if not Path(path).is_dir():
                problems.append(f"{row['id']}: active but {path} is missing")
        branches = set(git(repo, "for-each-ref", "--format=%(refname)", "refs/heads").split())
        snaps = set(git(repo, "for-each-ref", "--format=%(refname)", "refs/xum").split())
        for row in mine:
            if row["state"] != "archived":
                continue
            if row["branch"] and f"refs/heads/{row['branch']}" not in branches:
                problems.append(f"{row['id']}: archived, but branch {row['branch']} is gone")
            if row["snapshot_ref"] and row["snapshot_ref"] not in snaps:
                problems.append(f"{row['id']}: snapshot ref {row['snapshot_ref']} is gone")
            if Path(row["path"]).exists():
                problems.append(f"{row['id']}: archived, but {row['path']} still exists")
    return problems
