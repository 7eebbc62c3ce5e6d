"""Cleanup status and obligations (physical steps after a logical archive/remove)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from xum_protocol.methods_base import MethodSpec
from xum_protocol.models.base import Result

CleanupState = Literal["completed", "pending", "not_needed", "failed"]
ReclaimState = Literal["completed", "pending", "not_needed", "failed"]


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
    reason: str | None = Field(default=None, description="Why `failed` or `not_needed`.")
    reclaim: ReclaimStatus | None = None
    obligations: list[str] = Field(default_factory=list, description="Ids of pending steps.")


METHODS: list[MethodSpec] = []
