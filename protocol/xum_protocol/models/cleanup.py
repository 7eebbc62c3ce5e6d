"""Cleanup status and obligations (physical steps after a logical archive/remove)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from xum_protocol.methods_base import MethodSpec
from xum_protocol.models.base import Params, Result

CleanupState = Literal["completed", "pending", "not_needed", "failed"]
ReclaimState = Literal["completed", "pending", "not_needed", "failed"]

ObligationKind = Literal["teardown", "trash", "prune", "reclaim", "remove_dir"]
ObligationState = Literal["pending", "completed", "abandoned", "failed"]

OBLIGATION_EVENT = "cleanup.obligation_changed"
"""Event type published for every obligation state change (data: `obligation`)."""


class ReclaimStatus(Result):
    status: ReclaimState
    bytes: int | None = Field(default=None, description="Bytes reclaimed or still to reclaim.")


class CleanupStatus(Result):
    """What happened to the physical side of an archive or removal. `completed` is only ever
    reported for a cleanup that completed; `pending` always says when the next attempt is."""

    status: CleanupState
    attempts: int = 0
    next_attempt_at: float | None = None
    last_error: str | None = None
    reason: str | None = Field(
        default=None,
        description="Why `failed` or `not_needed`; for `pending` in an answer cut short by a "
        "shutdown, that it was (the retry service completes it when the daemon next runs).",
    )
    reclaim: ReclaimStatus | None = None
    obligations: list[str] = Field(default_factory=list, description="Ids of pending steps.")


class Obligation(Result):
    """One durable physical step: committed before it is attempted, fenced when it runs."""

    id: str
    workspace_id: str
    project_id: str
    kind: ObligationKind
    seq: int = Field(description="Order of the steps of one workspace (teardown first).")
    path: str
    incarnation: str
    state: ObligationState
    attempts: int = 0
    next_attempt_at: float | None = Field(
        default=None, description="Wall time of the next attempt (pending only)."
    )
    last_error: str | None = Field(default=None, description="Bounded, keeps the diagnostic tail.")
    reason: str | None = Field(default=None, description="Why `abandoned` or `failed`.")
    bytes: int | None = Field(default=None, description="reclaim: bytes freed (or to free).")
    detail: dict[str, Any] = Field(default_factory=dict)
    created_at: float
    updated_at: float


class CleanupListParams(Params):
    workspace_id: str | None = Field(default=None, max_length=64)
    state: ObligationState | None = None
    limit: int = Field(default=500, ge=1, le=10_000)


class CleanupListResult(Result):
    obligations: list[Obligation]
    pending: int = Field(description="Pending obligations in total (not only those listed).")


class CleanupRetryParams(Params):
    """Neither id: run one bounded cycle of everything due. An id: run that scope now."""

    obligation_id: str | None = Field(default=None, max_length=64)
    workspace_id: str | None = Field(default=None, max_length=64)

    @model_validator(mode="after")
    def _one_scope(self) -> CleanupRetryParams:
        if self.obligation_id is not None and self.workspace_id is not None:
            raise ValueError("give obligation_id or workspace_id, not both")
        return self


class CleanupRetryResult(Result):
    attempted: list[Obligation] = Field(
        default_factory=list, description="Obligations of the scope, as they are after the run."
    )
    workspaces: dict[str, CleanupStatus] = Field(
        default_factory=dict, description="Cleanup status of each workspace touched."
    )


class CleanupSummary(Result):
    """`daemon.status` details['cleanup']."""

    pending: int
    abandoned: int = Field(description="Abandoned obligations still listed (recent).")
    oldest: Obligation | None = Field(default=None, description="The oldest pending obligation.")


CLEANUP_LIST = MethodSpec(
    "cleanup.list",
    CleanupListParams,
    CleanupListResult,
    "Cleanup obligations: pending, and recently completed or abandoned.",
)
CLEANUP_RETRY = MethodSpec(
    "cleanup.retry",
    CleanupRetryParams,
    CleanupRetryResult,
    "Run pending cleanup now (one obligation's workspace, a workspace, or all due).",
    mutating=True,
)
