"""Base classes shared by every params/result model.

`defer_build`: a model's validator is built on first use, not at import. The daemon and the CLI
import every model of the protocol but use a few per run; building them all costs start-up time.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Params(BaseModel):
    """Request params: unknown fields are refused, so a typo is an error and not a silent no-op."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Result(BaseModel):
    """Results and events: extra fields are kept, so an older client reads a newer 1.x server."""

    model_config = ConfigDict(extra="allow", defer_build=True)
