"""Audit: `cleanup.list` naming a workspace the daemon never knew is an error, not an empty list.

Every other read that takes a workspace id (`workspace.get`, `process.list`, `turn.list`)
answers `not_found` / `invalid_scope` for an unknown or wrong-kind id; an empty success would
tell a client "nothing pending for it" about a typo. A removed workspace (tombstoned) still lists
its obligations.
"""

from __future__ import annotations

from typing import Any

from tests.support.daemon import DaemonProcess
from tests.support.lifecycle_helpers import create, rpc_error


def test_cleanup_list_refuses_unknown_and_wrong_kind_workspace_ids(
    daemon: DaemonProcess, project: dict[str, Any]
) -> None:
    err = rpc_error(daemon, "cleanup.list", {"workspace_id": "ws_0123456789abcdef"})
    assert err.kind == "not_found", err
    err = rpc_error(daemon, "cleanup.list", {"workspace_id": project["id"]})
    assert err.kind == "invalid_scope", err

    ws = create(daemon, project["id"], "w")["workspace"]
    assert daemon.call("cleanup.list", {"workspace_id": ws["id"]})["obligations"] == []
    daemon.call("workspace.remove", {"workspace_id": ws["id"]})
    listed = daemon.call("cleanup.list", {"workspace_id": ws["id"]})["obligations"]
    assert {o["kind"] for o in listed} >= {"trash", "reclaim"}
    assert daemon.call("cleanup.list", {})["pending"] >= 0
