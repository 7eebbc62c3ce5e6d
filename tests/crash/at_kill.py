"""The durable order at the moment of the kill: intent committed -> point -> effect on
disk -> point -> completion committed. Read before the restart (the daemon is dead, recovery has
not touched anything), each point's name says what must already be committed and what must not
yet be on disk. So moving an effect before its intent commit (`git worktree add` before the
`creating` row, a rename before its journal) fails the crash matrix itself, even where recovery
would later tidy the result up."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.crash.invariants import git_worktrees
from tests.crash.world import World
from tests.support.gitrepo import git

Row = dict[str, Any]


def _db(world: World) -> sqlite3.Connection:
    db = sqlite3.connect(world.root / "state.db")
    db.row_factory = sqlite3.Row
    return db


def _workspace(db: sqlite3.Connection, subject: str | None) -> Row | None:
    if subject is None:  # the create drivers make workspace "a"
        found = db.execute("SELECT * FROM workspaces WHERE name = 'a'").fetchone()
    else:
        found = db.execute("SELECT * FROM workspaces WHERE id = ?", (subject,)).fetchone()
    return dict(found) if found else None


def _is_worktree(world: World, path: str) -> bool:
    return os.path.realpath(path) in {os.path.realpath(p) for p in git_worktrees(world.repo)}


def _snapshot_of(world: World, row: Row) -> bool:
    ref = f"refs/xum/snapshots/{row['id']}/{row['incarnation']}"
    return bool(git(world.repo, "for-each-ref", "--format=%(refname)", ref).strip())


def _trash_ob(db: sqlite3.Connection, row: Row) -> Row | None:
    found = db.execute(
        "SELECT * FROM cleanup_obligations WHERE workspace_id = ? AND incarnation = ?"
        " AND kind = 'trash' ORDER BY seq DESC LIMIT 1",
        (row["id"], row["incarnation"]),
    ).fetchone()
    return dict(found) if found else None


def _checkout_absent(world: World, row: Row, state: str) -> list[str]:
    problems = []
    if row["state"] != state:
        problems.append(f"state is {row['state']}, not {state}: the intent is not committed")
    if os.path.lexists(row["path"]):
        problems.append(f"{row['path']} exists before the effect (made before the intent?)")
    if _is_worktree(world, row["path"]):
        problems.append(f"git already has a worktree at {row['path']} (added before the intent?)")
    return problems


def _checkout_made(world: World, row: Row, state: str) -> list[str]:
    problems = []
    if row["state"] != state:
        problems.append(f"state is {row['state']}, not {state}: completion committed too early")
    if not _is_worktree(world, row["path"]):
        problems.append(f"no worktree at {row['path']} after the checkout point")
    return problems


def _snapshot_pending(world: World, row: Row, state: str) -> list[str]:
    problems = []
    if row["state"] != state:
        problems.append(f"state is {row['state']}, not {state}: the intent is not committed")
    if _snapshot_of(world, row):
        problems.append("the snapshot exists before the intent point (taken before the intent?)")
    if not os.path.isdir(row["path"]):
        problems.append("the checkout is gone before the snapshot")
    return problems


def _snapshot_taken(world: World, row: Row, state: str) -> list[str]:
    problems = []
    if row["state"] != state:
        problems.append(f"state is {row['state']}, not {state}: completion committed too early")
    if not _snapshot_of(world, row):
        problems.append("no snapshot at the after_snapshot point")
    if not os.path.isdir(row["path"]):
        problems.append("the checkout is gone before the completion was committed")
    return problems


def _journal(db: sqlite3.Connection, row: Row) -> Row | None:
    found = db.execute(
        "SELECT * FROM rename_journal WHERE workspace_id = ?", (row["id"],)
    ).fetchone()
    return dict(found) if found else None


def _rename_journaled(world: World, db: sqlite3.Connection, row: Row) -> list[str]:
    journal = _journal(db, row)
    if journal is None:
        return ["no rename journal at the after_journal point"]
    problems = []
    if not os.path.isdir(journal["from_path"]) or os.path.lexists(journal["to_path"]):
        problems.append("the checkout moved before the journal point (moved before the intent?)")
    return problems


def _rename_moved(world: World, db: sqlite3.Connection, row: Row) -> list[str]:
    journal = _journal(db, row)
    if journal is None:
        return ["the journal is gone at the after_move point: completion committed too early"]
    if os.path.lexists(journal["from_path"]) or not os.path.isdir(journal["to_path"]):
        return ["the checkout did not move before the after_move point"]
    return []


def _trash(world: World, db: sqlite3.Connection, row: Row, *, moved: bool) -> list[str]:
    ob = _trash_ob(db, row)
    if ob is None:
        return ["no trash obligation committed before the trash point"]
    detail = json.loads(ob["detail"] or "{}")
    trash_path = detail.get("trash_path")
    problems = []
    if ob["state"] != "pending":
        problems.append(f"the trash step is {ob['state']}: completion committed too early")
    if not trash_path:
        problems.append("the trash path is not committed before the move")
        return problems
    if moved and (os.path.lexists(row["path"]) or not os.path.isdir(trash_path)):
        problems.append("the checkout is not in the trash at the after_rename point")
    if not moved and (not os.path.isdir(row["path"]) or os.path.lexists(trash_path)):
        problems.append("the checkout moved before the before_rename point")
    return problems


def _carry_ref(world: World, row: Row) -> bool:
    ref = f"refs/xum/carry/{row['id']}"
    return bool(git(world.repo, "for-each-ref", "--format=%(refname)", ref).strip())


def _carry_captured(world: World, row: Row) -> list[str]:
    problems = _checkout_absent(world, row, "creating")
    if not _carry_ref(world, row):
        problems.append("no carry ref at the after_capture point")
    return problems


def _carry_moving(world: World, row: Row) -> list[str]:
    problems = []
    if row["state"] != "active":
        problems.append(f"state is {row['state']}: the move began before `active` committed")
    if not _carry_ref(world, row):
        problems.append("the carry ref is gone before the move finished")
    return problems


def _pool_claim(world: World, db: sqlite3.Connection, row: Row, *, moved: bool) -> list[str]:
    """A claim's entry row stays `claiming` (naming the workspace) until the workspace has
    taken the checkout over; the checkout is at the entry's path before the move, at the
    workspace's after it, and carries the pool's marker until then."""
    entry = db.execute("SELECT * FROM pool_entries WHERE claimed_by = ?", (row["id"],)).fetchone()
    if entry is None:
        return ["no `claiming` entry row names the workspace: the claim's intent is not committed"]
    problems = [] if entry["state"] == "claiming" else [f"the entry is {entry['state']}"]
    here, there = (row["path"], entry["path"]) if moved else (entry["path"], row["path"])
    if not _is_worktree(world, here):
        problems.append(f"no worktree at {here}")
    if os.path.lexists(there):
        problems.append(f"{there} exists: the move is not where the point says")
    locked = git(world.repo, "worktree", "list", "--porcelain")
    if f"locked xum-pool {entry['id']} " not in locked:
        problems.append("the checkout no longer carries the pool's marker before the takeover")
    return problems


def _pool_taken(world: World, db: sqlite3.Connection, row: Row) -> list[str]:
    problems = _checkout_made(world, row, "creating")
    entry = db.execute("SELECT * FROM pool_entries WHERE claimed_by = ?", (row["id"],)).fetchone()
    if entry is None:
        problems.append("the entry row is gone before the claim's last transaction")
    branch = git(Path(row["path"]), "symbolic-ref", "HEAD").strip()
    if branch != f"refs/heads/{row['branch']}":
        problems.append(f"HEAD is {branch}, not the workspace's branch, after the branch point")
    return problems


Check = Callable[[World, sqlite3.Connection, Row], list[str]]

CHECKS: dict[str, Check] = {
    "workspace.create.after_intent": lambda w, db, r: _checkout_absent(w, r, "creating"),
    "workspace.create.after_checkout": lambda w, db, r: _checkout_made(w, r, "creating"),
    "workspace.create.carry.after_capture": lambda w, db, r: _carry_captured(w, r),
    "workspace.create.carry.after_restore": lambda w, db, r: _checkout_made(w, r, "creating"),
    "workspace.create.carry.mid_move": lambda w, db, r: _carry_moving(w, r),
    "workspace.unarchive.after_intent": lambda w, db, r: _checkout_absent(w, r, "restoring"),
    "workspace.unarchive.after_checkout": lambda w, db, r: _checkout_made(w, r, "restoring"),
    "workspace.archive.after_intent": lambda w, db, r: _snapshot_pending(w, r, "archiving"),
    "workspace.archive.after_snapshot": lambda w, db, r: _snapshot_taken(w, r, "archiving"),
    "workspace.remove.after_intent": lambda w, db, r: _snapshot_pending(w, r, "removing"),
    "workspace.remove.after_snapshot": lambda w, db, r: _snapshot_taken(w, r, "removing"),
    "workspace.rename.after_journal": _rename_journaled,
    "workspace.rename.after_move": _rename_moved,
    "cleanup.trash.before_rename": lambda w, db, r: _trash(w, db, r, moved=False),
    "cleanup.trash.after_rename": lambda w, db, r: _trash(w, db, r, moved=True),
    "pool.claim.after_intent": lambda w, db, r: _pool_claim(w, db, r, moved=False),
    "pool.claim.after_move": lambda w, db, r: _pool_claim(w, db, r, moved=True),
    "pool.claim.after_branch": _pool_taken,
}
"""Points whose name promises an order on disk. The others (undo, setup, recovery, turn,
process points) are covered by the invariants after the restart."""


def order_problems(world: World, point: str, subject: str | None) -> list[str]:
    """What the disk and the store show at the kill, against what `point` promises."""
    check = CHECKS.get(point)
    if check is None:
        return []
    proc = world.d.proc
    assert proc is not None and proc.poll() is not None, "read the state only once it is dead"
    db = _db(world)
    try:
        row = _workspace(db, subject)
        if row is None:
            return [f"[{point}: at the kill] no workspace row: the intent was not committed"]
        return [f"[{point}: at the kill] {p}" for p in check(world, db, row)]
    finally:
        db.close()


def covered_points() -> list[str]:
    return sorted(CHECKS)
