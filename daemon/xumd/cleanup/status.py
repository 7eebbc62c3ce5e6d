"""What cleanup reports: a workspace's status (design invariant 2: no false success), the daemon's
summary, and the scope a retry names (unknown ids are errors, never a no-op).

A workspace's status is `completed` only when every step that frees its path completed; the
reclaim of the trash entry is reported apart (`reclaim`), since the path is free before it.
"""

from __future__ import annotations

from typing import Any

from xum_protocol.errors import ErrorKind
from xum_protocol.models.cleanup import CleanupStatus, CleanupSummary, ReclaimStatus

from xumd.base.errors import XumError
from xumd.cleanup.obligations import (
    ABANDONED,
    COMPLETED,
    FAILED,
    PENDING,
    ObligationRow,
    Obligations,
)


def workspace_status(obligations: Obligations, workspace_id: str) -> CleanupStatus | None:
    """The latest cleanup status of a workspace (its latest incarnation's obligations)."""
    return status_of(obligations.for_workspace(workspace_id))


def status_of(obs: list[ObligationRow]) -> CleanupStatus | None:
    """The status that one workspace's obligations (all of them, in `for_workspace` order)
    make: listings read the obligations of many workspaces in one query."""
    if not obs:
        return None
    latest = max(obs, key=lambda o: (o.created_at, o.seq)).incarnation
    obs = [o for o in obs if o.incarnation == latest]
    path_obs = [o for o in obs if o.kind != "reclaim"]
    reclaim_obs = [o for o in obs if o.kind == "reclaim"]
    pending = [o for o in path_obs if o.state == PENDING]
    closed = [o for o in path_obs if o.state in (ABANDONED, FAILED)]
    if pending:
        with_error = [o for o in pending if o.last_error]
        status = CleanupStatus(
            status="pending",
            attempts=max(o.attempts for o in pending),
            next_attempt_at=min(o.next_attempt_at for o in pending),
            last_error=with_error[0].last_error if with_error else None,
        )
    elif closed:
        status = CleanupStatus(
            status="failed",
            attempts=max(o.attempts for o in closed),
            reason="; ".join(f"{o.kind}: {o.reason}" for o in closed),
            last_error=next((o.last_error for o in closed if o.last_error), None),
        )
    elif not path_obs:
        status = CleanupStatus(status="not_needed", reason="only a trash entry to reclaim")
    else:
        status = CleanupStatus(status="completed", attempts=max(o.attempts for o in path_obs))
    status.obligations = [o.id for o in obs if o.state == PENDING]
    if reclaim_obs:
        status.reclaim = _reclaim_status(reclaim_obs[-1])
    return status


def summary(obligations: Obligations) -> CleanupSummary:
    oldest = obligations.oldest_pending()
    return CleanupSummary(
        pending=obligations.count(PENDING),
        abandoned=obligations.count(ABANDONED),
        oldest=oldest.model() if oldest else None,
    )


def summary_details(obligations: Obligations) -> dict[str, Any]:
    """`summary(obligations).model_dump(mode="json")`, written without the models: monitors
    poll `daemon.status`, and building `CleanupSummary` and `Obligation` at the first poll held
    ~1.2 MiB for the daemon's life (docs/PERFORMANCE.md, "Start-up with records")."""
    oldest = obligations.oldest_pending()
    return {
        "pending": obligations.count(PENDING),
        "abandoned": obligations.count(ABANDONED),
        "oldest": oldest.as_json() if oldest else None,
    }


def require_known(
    obligations: Obligations, *, obligation_id: str | None, workspace_id: str | None
) -> str:
    """The workspace a retry scope names; unknown ids are errors, never a no-op."""
    if obligation_id is not None:
        _check_prefix(obligation_id, "ob_", "obligation")
        ob = obligations.get(obligation_id)
        if ob is None:
            raise XumError(
                ErrorKind.NOT_FOUND,
                f"cleanup obligation {obligation_id!r} not found",
                id=obligation_id,
            )
        return ob.workspace_id
    assert workspace_id is not None
    _check_prefix(workspace_id, "ws_", "workspace")
    if not obligations.for_workspace(workspace_id):
        raise XumError(
            ErrorKind.NOT_FOUND,
            f"workspace {workspace_id!r} has no cleanup obligations",
            id=workspace_id,
        )
    return workspace_id


def _reclaim_status(ob: ObligationRow) -> ReclaimStatus:
    bytes_ = ob.detail.get("bytes")
    if ob.state == PENDING:
        return ReclaimStatus(status="pending")
    if ob.state == COMPLETED:
        needed = ob.detail.get("needed", True)
        return ReclaimStatus(
            status="completed" if needed else "not_needed",
            bytes=bytes_ if isinstance(bytes_, int) else None,
        )
    return ReclaimStatus(status="failed")


def _check_prefix(value: str, prefix: str, what: str) -> None:
    if not value.startswith(prefix):
        raise XumError(
            ErrorKind.INVALID_SCOPE,
            f"{value!r} is not a {what} id (a {what} id starts with {prefix!r})",
            id=value,
        )
