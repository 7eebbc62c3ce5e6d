"""Base classes shared by every params/result model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Params(BaseModel):
    """Request params: unknown fields are refused, so a typo is an error and not a silent no-op."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Result(BaseModel):
    """Results and events: extra fields are kept, so an older client reads a newer 1.x server."""

    model_config = ConfigDict(extra="allow")
