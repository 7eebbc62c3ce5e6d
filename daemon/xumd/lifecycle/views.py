"""Rows -> protocol models (pure, synchronous: usable in event snapshots)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from xum_protocol.models.cleanup import CleanupStatus
from xum_protocol.models.project import ProjectInfo
from xum_protocol.models.workspace import DroppedInfo, ScriptResult, SnapshotInfo, WorkspaceInfo

from xumd.lifecycle.rows import ProjectRow, WorkspaceRow
from xumd.lifecycle.snapshot import Dropped, Snapshot

CleanupLookup = Callable[[str], CleanupStatus | None]


def workspaces_dir(root_workspaces: Path, project: ProjectRow) -> Path:
    return (
        Path(project.workspaces_dir) if project.workspaces_dir else root_workspaces / project.name
    )


def project_info(project: ProjectRow, root_workspaces: Path) -> ProjectInfo:
    return ProjectInfo(
        id=project.id,
        name=project.name,
        path=str(project.path),
        kind="git" if project.kind == "git" else "directory",
        workspaces_dir=str(workspaces_dir(root_workspaces, project)),
        trusted_config_hash=project.trusted_config_hash,
        created_at=project.created_at,
        updated_at=project.updated_at,
    )


def _last_cleanup(row: WorkspaceRow, lookup: CleanupLookup | None) -> CleanupStatus | None:
    if lookup is not None:
        found = lookup(row.id)
        if found is not None:
            return found
    if row.last_cleanup:
        try:
            return CleanupStatus.model_validate(json.loads(row.last_cleanup))
        except ValueError:
            return None
    return None


def workspace_info(row: WorkspaceRow, lookup: CleanupLookup | None = None) -> WorkspaceInfo:
    detail = row.setup_detail()
    setup = ScriptResult.model_validate({**detail, "status": row.setup_status})
    snapshot = (
        SnapshotInfo(ref=row.snapshot_ref, commit=row.snapshot_commit)
        if row.snapshot_ref and row.snapshot_commit
        else None
    )
    return WorkspaceInfo.model_validate(
        {
            "id": row.id,
            "project_id": row.project_id,
            "name": row.name,
            "runtime": row.runtime,
            "path": str(row.path),
            "branch": row.branch,
            "base": row.base,
            "state": row.state,
            "incarnation": row.incarnation,
            "interrupted": row.interrupted,
            "interrupted_reason": row.interrupted_reason,
            "setup": setup,
            "snapshot": snapshot,
            "last_cleanup": _last_cleanup(row, lookup),
            "handle_id": row.handle_id,
            "owner_workspace_id": row.owner_workspace_id,
            "created_at": row.created_at,
            "updated_at": row.updated_at,
        }
    )


def snapshot_info(snap: Snapshot | None) -> SnapshotInfo | None:
    return SnapshotInfo.model_validate(snap.as_dict()) if snap else None


def dropped_info(dropped: Dropped) -> DroppedInfo:
    return DroppedInfo.model_validate(dropped.as_dict())
