"""`strays.scan` checks a directory's checkouts against the claims a chunk at a time
(recovery/strays.py `_Claims`): a checkout a row claims, one only an unfinished cleanup step
names, and one a row claims through a link are never strays, in a directory of more entries than
a chunk; every other one is, and one a finished step named is."""

from __future__ import annotations

import dataclasses
import os
import secrets
import time
from pathlib import Path

from xumd.base.paths import RootPaths
from xumd.cleanup.obligations import ObligationRow, Obligations
from xumd.lifecycle import rows, views
from xumd.recovery import strays
from xumd.store import Store

from tests.processes.test_support import insert_workspace


def _row(store: Store, project_id: str, path: Path) -> str:
    workspace_id = "ws_" + secrets.token_hex(8)
    now = time.time()
    with store.transaction() as db:
        db.execute(
            "INSERT INTO workspaces (id, project_id, name, runtime, path, state, incarnation, "
            "setup_status, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                workspace_id,
                project_id,
                path.name,
                "directory",
                str(path),
                "active",
                secrets.token_hex(16),
                "none",
                now,
                now,
            ),
        )
    return workspace_id


def _step(obligations: Obligations, path: Path, state: str) -> None:
    row = ObligationRow.due_now(
        id="ob_" + secrets.token_hex(8),
        workspace_id="ws_" + secrets.token_hex(8),
        project_id="prj_" + secrets.token_hex(8),
        kind="trash",
        seq=0,
        path=str(path),
        dev=None,
        ino=None,
        incarnation=secrets.token_hex(16),
        detail={},
        now=time.time(),
    )
    with obligations.store.transaction():
        obligations.insert(dataclasses.replace(row, state=state))


def _project_home(tmp_short: Path) -> tuple[Store, RootPaths, str, Path]:
    root = tmp_short / "root"
    insert_workspace(root, tmp_short / "elsewhere" / "first")
    store = Store(root / "state.db")
    (project,) = rows.list_projects(store)
    home = views.workspaces_dir(RootPaths(root).workspaces, project)
    home.mkdir(parents=True)
    return store, RootPaths(root), project.id, home


def test_claims_by_row_step_and_link_over_more_than_a_chunk(tmp_short: Path) -> None:
    root = tmp_short / "root"
    insert_workspace(root, tmp_short / "elsewhere" / "first")
    store = Store(root / "state.db")
    paths = RootPaths(root)
    (project,) = rows.list_projects(store)
    home = views.workspaces_dir(paths.workspaces, project)
    home.mkdir(parents=True)
    for index in range(strays.CHUNK * 2 + 7):
        (home / f"w{index}").mkdir()
        _row(store, project.id, home / f"w{index}")
    obligations = Obligations(store)
    (home / "stepped").mkdir()
    _step(obligations, home / "stepped", "pending")
    (home / "finished").mkdir()
    _step(obligations, home / "finished", "completed")
    # A row that names its checkout through a link to the directory it is in.
    (home / "linked").mkdir()
    os.symlink(home, tmp_short / "alias")
    _row(store, project.id, tmp_short / "alias" / "linked")
    (home / "nobody").mkdir()
    try:
        found = strays.scan(store, paths)
    finally:
        store.close()
    assert [(s.kind, s.path, s.project_id) for s in found] == [
        ("checkout", str(home / "finished"), project.id),
        ("checkout", str(home / "nobody"), project.id),
    ]


def test_a_rename_journal_claims_both_its_paths(tmp_short: Path) -> None:
    """A rename cut short between its journal and its row: the checkout may be at either path,
    and neither is a stray; a directory no journal names beside them is."""
    store, paths, project_id, home = _project_home(tmp_short)
    workspace_id = _row(store, project_id, tmp_short / "elsewhere" / "row-path")
    for name in ("old", "new", "nobody"):
        (home / name).mkdir()
    with store.transaction() as db:
        db.execute(
            "INSERT INTO rename_journal (workspace_id, from_name, to_name, from_path, to_path,"
            " incarnation, phase, created_at) VALUES (?,?,?,?,?,?,'intent',?)",
            (workspace_id, "old", "new", str(home / "old"), str(home / "new"), "i", time.time()),
        )
    try:
        found = strays.scan(store, paths)
    finally:
        store.close()
    assert [s.path for s in found] == [str(home / "nobody")]


def test_a_path_a_step_claims_is_settled_by_its_chunk_s_lookup(tmp_short: Path) -> None:
    """A path only an unfinished step claims is claimed by the chunk's lookup among the steps:
    every claimed path is never loaded for it, and the paths after it in the chunk are still
    checked (in the order asked, not the directory's)."""
    store, _, project_id, home = _project_home(tmp_short)
    _row(store, project_id, home / "row")
    _step(Obligations(store), home / "stepped", "pending")
    try:
        claims = strays._Claims(store)
        assert claims.unclaimed([str(home / "stepped"), str(home / "row")]) == []
        assert claims._real is None
        assert claims.unclaimed([str(home / "stepped"), str(home / "nobody")]) == [
            str(home / "nobody")
        ]
    finally:
        store.close()
