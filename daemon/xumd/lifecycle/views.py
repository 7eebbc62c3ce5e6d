"""Rows -> protocol models (pure, synchronous: usable in event snapshots)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel
from xum_protocol.models.cleanup import CleanupStatus
from xum_protocol.models.project import ProjectInfo
from xum_protocol.models.workspace import (
    AutoArchiveOutcome,
    DroppedInfo,
    RawEntryInfo,
    ScriptResult,
    SnapshotInfo,
    WorkspaceInfo,
)

from xumd.lifecycle.onbytes import RawEntry
from xumd.lifecycle.rows import ProjectRow, WorkspaceRow
from xumd.lifecycle.snapshot import Dropped, Snapshot

M = TypeVar("M", bound=BaseModel)
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


def _stored(model: type[M], text: str | None) -> M | None:
    """A JSON column (some written by other features) as its model; an unreadable one is shown
    as absent: workspace.get never fails on it."""
    if not text:
        return None
    try:
        return model.model_validate(json.loads(text))
    except ValueError:  # bad JSON, or pydantic's ValidationError
        return None


def _last_cleanup(row: WorkspaceRow, lookup: CleanupLookup | None) -> CleanupStatus | None:
    found = lookup(row.id) if lookup is not None else None
    return found or _stored(CleanupStatus, row.last_cleanup)


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
            "auto_archive": row.auto_archive,
            "auto_archive_outcome": _stored(AutoArchiveOutcome, row.auto_archive_outcome),
            "created_at": row.created_at,
            "updated_at": row.updated_at,
        }
    )


def snapshot_info(snap: Snapshot | None) -> SnapshotInfo | None:
    return SnapshotInfo.model_validate(snap.as_dict()) if snap else None


def dropped_info(dropped: Dropped) -> DroppedInfo:
    return DroppedInfo.model_validate(dropped.as_dict())


def raw_info(raw: list[RawEntry]) -> list[RawEntryInfo]:
    return [RawEntryInfo.model_validate(e.as_dict()) for e in raw]
