"""The bench's records are rows the daemon writes: `bench.scale.populate` has a real daemon make
the first workspace of each kind through the API (active; archived, its cleanup complete;
archived with its cleanup pending, its teardown failing) and copies those rows to scale. Every
copy is its template column for column but the columns a workspace has of its own, its own
values in place of the template's inside the others (and so are their cleanup steps); a daemon
started on the root changes none of them, workspaces or cleanup steps (its startup pass finds
them consistent with the disk, no pending step is due), and `workspace.list` builds every one
directly, as it does the rows the API writes (tests/lifecycle/test_workspace_list_paging.py).
The rows tests/support/manyrows.py writes for the tests at scale are held to a row a real
daemon wrote the same way."""

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


def _own_values(
    template: dict[str, Any], copy: dict[str, Any], steps: dict[str, Any]
) -> dict[str, str]:
    """What a copy has of its own in place of its template's, inside the other columns: its id,
    path, name (a JSON string) and its steps' ids (matched by step number)."""
    mine = {
        template["id"]: copy["id"],
        template["path"]: copy["path"],
        '"' + template["name"] + '"': '"' + copy["name"] + '"',
    }
    for original, step in zip(steps[template["id"]], steps[copy["id"]], strict=True):
        mine[original["id"]] = step["id"]
    return mine


def test_the_bench_records_are_copies_of_rows_the_api_wrote() -> None:
    work = procs.short_dir("xbr-")
    try:
        root = work / "root"
        # 8 pending steps asked: whole workspaces of 3 steps, so 3 workspaces and 9 steps.
        scale.populate(root, 50, 8)
        workspaces = _rows(root, "workspaces", "listing_seq")
        steps = _rows(root, "cleanup_obligations", "workspace_id, seq")
        assert len(workspaces) == 50
        # The first three rows are the API's (the daemon wrote them before any copy).
        templates = {w["name"]: w for w in workspaces[:3]}
        assert set(templates) == {"w0", "w9", "w19"}
        assert [templates[n]["state"] for n in ("w0", "w9", "w19")] == [
            "active",
            "archived",
            "archived",
        ]
        steps_of = {
            ws_id: [s for s in steps if s["workspace_id"] == ws_id]
            for ws_id in (w["id"] for w in workspaces)
        }
        assert {s["workspace_id"] for s in steps} <= set(steps_of)  # no step without its row
        done = steps_of[templates["w9"]["id"]]
        assert done and all(s["state"] == "completed" for s in done)
        held = steps_of[templates["w19"]["id"]]
        assert [(s["kind"], s["state"]) for s in held] == [
            ("teardown", "pending"),
            ("trash", "pending"),
            ("reclaim", "pending"),
        ]
        assert "exit 1" in held[0]["last_error"] and held[0]["attempts"] == 1
        assert templates["w9"]["last_cleanup"] and templates["w0"]["setup_output"]
        assert json.loads(templates["w19"]["last_cleanup"])["status"] == "pending"
        copies = workspaces[3:]
        pending = [w for w in workspaces if any(s["state"] == "pending" for s in steps_of[w["id"]])]
        assert [w["name"] for w in pending] == ["w19", "w29", "w39"]
        assert sum(s["state"] == "pending" for s in steps) == 9
        assert [w["name"] for w in copies if w["state"] == "archived"] == ["w29", "w39", "w49"]
        for copy in copies:
            name = copy["name"]
            template = templates[{"w29": "w19", "w39": "w19"}.get(name, "w9")]
            if copy["state"] == "active":
                template = templates["w0"]
            mine = _own_values(template, copy, steps_of)
            for column, value in template.items():
                if column not in scale.OWN_COLUMNS:
                    assert copy[column] == _replaced(value, mine), (name, column)
            for column in ("id", "name", "path", "incarnation"):
                assert copy[column] != template[column], (name, column)
            for text in copy.values():
                assert template["id"] not in str(text), name
            for step, original in zip(steps_of[copy["id"]], steps_of[template["id"]], strict=True):
                for column, value in original.items():
                    if column not in scale.OWN_OBLIGATION_COLUMNS:
                        assert step[column] == _replaced(value, mine), (name, column)
                assert step["incarnation"] == copy["incarnation"]
                assert step["path"] == _replaced(original["path"], mine)
                assert (step["dev"], step["ino"]) == (copy["dev"], copy["ino"])
                assert original["id"] not in str(step["detail"]), name
            # A checkout the row says exists is there, its own (the startup pass checks).
            path = Path(copy["path"])
            if copy["state"] == "active" or copy in pending:
                stat = path.stat()
                assert (stat.st_dev, stat.st_ino) == (copy["dev"], copy["ino"])
                marker = (path / scale.MARKER).read_text()
                assert copy["id"] in marker and copy["incarnation"] in marker
            else:
                assert not path.exists()
        # A daemon started on the root finds every record consistent: it rewrites none, and
        # runs no cleanup step (none is due) nor changes one, its retry service having looked
        # (its first look also bounds every pending retry by the configured cap).
        daemon = DaemonProcess(root).start()  # until XUM_RECONCILED=1
        try:
            daemon.call("daemon.status")
        finally:
            daemon.close()
        [stopped] = [
            json.loads(line)
            for line in daemon.log_text().splitlines()
            if '"cleanup.retry_stopped"' in line
        ]
        assert stopped["cycles"] >= 1, stopped
        assert _rows(root, "workspaces", "listing_seq") == workspaces
        assert _rows(root, "cleanup_obligations", "workspace_id, seq") == steps
        with installed_app(root) as app:
            svc = app.get(WorkspaceService)
            fell_back: list[str] = []

            def model_path(ws_id: str) -> dict[str, Any]:
                fell_back.append(ws_id)
                return svc._info_json(ws_id)

            assert len(listing.listing(app.store, model_path)["workspaces"]) == 50
            assert fell_back == []
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _replaced(value: Any, mine: dict[str, str]) -> Any:
    if not isinstance(value, str):
        return value
    for theirs, ours in mine.items():
        value = value.replace(theirs, ours)
    return value


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
