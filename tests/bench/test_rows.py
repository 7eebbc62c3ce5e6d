"""The bench's records are rows the daemon writes: `bench.scale.populate` has a real daemon make
the first workspace of each kind through the API and copies those rows to scale. Every copy is
its template column for column but the columns a workspace has of its own (and so are their
cleanup steps); a daemon started on the root changes none of them (its startup pass finds them
consistent with the disk), and `workspace.list` builds every one directly, as it does the rows
the API writes (tests/lifecycle/test_workspace_list_paging.py). The rows tests/support/manyrows.py
writes
for the tests at scale are held to a row a real daemon wrote the same way."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

from xumd.lifecycle import listing
from xumd.lifecycle.service import WorkspaceService

from bench import procs, scale
from tests.support import manyrows
from tests.support.daemon import DaemonProcess
from tests.support.inproc import installed_app
from tests.support.wait import until


def _rows(root: Path, table: str, order: str) -> list[dict[str, Any]]:
    db = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in db.execute(f"SELECT * FROM {table} ORDER BY {order}")]
    finally:
        db.close()


def test_the_bench_records_are_copies_of_rows_the_api_wrote() -> None:
    work = procs.short_dir("xbr-")
    try:
        root = work / "root"
        scale.populate(root, 30, 3)
        workspaces = _rows(root, "workspaces", "listing_seq")
        steps = _rows(root, "cleanup_obligations", "workspace_id, seq")
        assert len(workspaces) == 30
        # The first two rows are the API's (the daemon wrote them before any copy).
        templates = {w["state"]: w for w in workspaces[:2]}
        assert set(templates) == {"active", "archived"}
        assert {w["name"] for w in templates.values()} == {"w0", "w9"}
        steps_of = {
            ws_id: [s for s in steps if s["workspace_id"] == ws_id]
            for ws_id in (w["id"] for w in workspaces)
        }
        archived_steps = steps_of[templates["archived"]["id"]]
        assert archived_steps and all(s["state"] == "completed" for s in archived_steps)
        assert templates["archived"]["last_cleanup"] and templates["active"]["setup_output"]
        copies = workspaces[2:]
        assert sum(w["state"] == "archived" for w in copies) == 2
        for copy in copies:
            template = templates[copy["state"]]
            for column, value in template.items():
                if column not in scale.OWN_COLUMNS:
                    assert copy[column] == value, (copy["name"], column)
            for column in ("id", "name", "path", "incarnation"):
                assert copy[column] != template[column], (copy["name"], column)
            mine = steps_of[copy["id"]]
            assert len(mine) == len(steps_of[template["id"]])
            for step, original in zip(mine, steps_of[template["id"]], strict=True):
                for column, value in original.items():
                    if column not in scale.OWN_OBLIGATION_COLUMNS:
                        assert step[column] == value, (copy["name"], column)
                assert step["incarnation"] == copy["incarnation"]
        removed = [s for s in steps if s["workspace_id"] not in steps_of]
        assert len(removed) == 3 and all(s["state"] == "pending" for s in removed)
        # A daemon started on the root finds every record consistent: it rewrites none.
        procs.xumd(root).start().stop()
        assert _rows(root, "workspaces", "listing_seq") == workspaces
        with installed_app(root) as app:
            svc = app.get(WorkspaceService)
            fell_back: list[str] = []

            def model_path(ws_id: str) -> dict[str, Any]:
                fell_back.append(ws_id)
                return svc._info_json(ws_id)

            assert len(listing.listing(app.store, model_path)["workspaces"]) == 30
            assert fell_back == []
    finally:
        shutil.rmtree(work, ignore_errors=True)


# Columns a workspace (or project) has of its own: compared for presence, not value.
_OWN = frozenset(
    {"id", "project_id", "path", "incarnation", "ino", "created_at", "updated_at", "listing_seq"}
)


def test_many_rows_are_the_rows_the_api_writes_column_for_column(tmp_short: Path) -> None:
    """tests/support/manyrows.py writes thousands of archived rows for the tests at scale: each
    is what a real daemon stores for a directory workspace made by `workspace.create` and
    archived, column for column, but for the columns a workspace has of its own (and the byte
    count its reclaim found)."""
    api_root = tmp_short / "api" / "root"
    project_dir = tmp_short / "api" / "many"
    project_dir.mkdir(parents=True)
    daemon = DaemonProcess(api_root).start()
    try:
        project = daemon.call("project.add", {"path": str(project_dir)})["project"]["id"]
        params = {"project_id": project, "name": "m0", "runtime": "directory"}
        ws_id = daemon.call("workspace.create", params)["workspace"]["id"]
        daemon.call("workspace.archive", {"workspace_id": ws_id})

        def settled() -> bool:
            found = daemon.call("workspace.get", {"workspace_id": ws_id})["workspace"]
            return bool(found["last_cleanup"]["reclaim"]["status"] == "completed")

        until(settled, message="the archive's reclaim completed")
    finally:
        daemon.close()
    manyrows.populate(tmp_short / "many" / "root", 1)
    for table in ("workspaces", "projects"):
        (api,) = _rows(api_root, table, "id")
        (many,) = _rows(tmp_short / "many" / "root", table, "id")
        assert set(api) == set(many)
        for column, value in api.items():
            if column in _OWN:
                assert (value is None) == (many[column] is None), (table, column)
            elif column == "last_cleanup":
                reclaimed = json.loads(value)["reclaim"]["bytes"]
                assert value == manyrows.kept_status(reclaimed)
                assert many[column] == manyrows.kept_status(manyrows.RECLAIMED_BYTES)
            else:
                assert many[column] == value, (table, column)
