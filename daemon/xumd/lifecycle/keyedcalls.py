"""What a keyed `workspace.create` or `workspace.archive` answers when a crash cut it before its
answer was recorded (`rpc.requestkeys`): read from the workspace as the startup pass left it.

A create binds its new workspace's id to the key in its intent transaction
(`base.requestkey.bind_target`): a workspace that is active is the create's result; one that
recovery took back (or no bound id: the crash came before the intent) means the create did not
happen, and it runs again. An archive's target is its params' workspace: archived is its result
(with the cleanup as it stands); still active (recovery rolled `archiving` back, or the crash
came before) means it did not happen. Neither ever does the operation a second time."""

from __future__ import annotations

from xum_protocol.models.cleanup import CleanupStatus
from xum_protocol.models.workspace import (
    DroppedInfo,
    WorkspaceArchiveParams,
    WorkspaceArchiveResult,
    WorkspaceCreateParams,
    WorkspaceCreateResult,
)

from xumd.lifecycle import rows
from xumd.lifecycle.context import Context


def created(
    ctx: Context, params: WorkspaceCreateParams, target: str | None
) -> WorkspaceCreateResult | None:
    row = rows.get_workspace(ctx.store, target) if target is not None else None
    if row is None or row.state != "active":
        return None
    info = ctx.info(row)
    return WorkspaceCreateResult(
        workspace=info,
        setup=info.setup,
        base_commit=row.base if row.runtime == "worktree" else None,
    )


def archived(
    ctx: Context, params: WorkspaceArchiveParams, target: str | None
) -> WorkspaceArchiveResult | None:
    row = rows.get_workspace(ctx.store, params.workspace_id)
    if row is None or row.state != "archived":
        return None
    info = ctx.info(row)
    return WorkspaceArchiveResult(
        workspace=info,
        snapshot=info.snapshot,
        dropped=DroppedInfo(),
        cleanup=ctx.cleanup.status(row.id)
        or CleanupStatus(status="not_needed", reason="no cleanup obligations"),
    )
