"""The directory runtime: a plain directory, archived into the archive store, nothing lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.lifecycle_helpers import add_project, create, rpc_error


@pytest.fixture
def project(daemon: DaemonProcess, tmp_short: Path) -> dict[str, Any]:
    plain = tmp_short / "plain"
    plain.mkdir()
    project = add_project(daemon, plain)
    assert project["kind"] == "directory"
    return project


def test_directory_workspace_round_trip(daemon: DaemonProcess, project: dict[str, Any]) -> None:
    err = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "w"})
    assert err.kind == "invalid_params"  # a plain directory has no git for a worktree
    ws = create(daemon, project["id"], "d", runtime="directory")["workspace"]
    path = Path(ws["path"])
    (path / "notes").mkdir()
    (path / "notes" / "a.txt").write_text("a\n")
    refused = rpc_error(daemon, "workspace.remove", {"workspace_id": ws["id"]})
    assert refused.kind == "not_safe"
    assert refused.data["files"] == ["notes/a.txt"]
    archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert archived["dropped"]["preserved"] == ["notes/a.txt"]
    assert archived["cleanup"]["status"] == "completed"
    assert not path.exists()
    back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert back["restored"]["preserved"] == ["notes/a.txt"]
    assert (path / "notes" / "a.txt").read_text() == "a\n"
    marker = (path / ".xum-incarnation").read_text().strip()
    assert marker == f"xum {ws['id']} {back['workspace']['incarnation']}"
    removed = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    assert removed["removed"] is True
    assert not path.exists()
