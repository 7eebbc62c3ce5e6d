"""What `workspace.create` reports beyond the checkout itself: the base fetch, the
sparse-checkout patterns it inherited, the submodules it initialised."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from xum_protocol.models.base import Result

FetchStatus = Literal["fetched", "failed", "timeout"]


class FetchInfo(Result):
    """The base's fetch (`fetch: true`). A failed or timed-out fetch is only ever here when the
    caller allowed a stale base (`allow_stale_base`); otherwise the create was refused."""

    status: FetchStatus
    remote: str = Field(description="The remote fetched.")
    stale: bool = Field(
        default=False, description="True when the fetch failed and the local base was used."
    )
    error: str | None = Field(default=None, description="Why the fetch failed (with git's tail).")
    base_ref: str | None = Field(
        default=None,
        description="The ref the base was resolved from after the fetch (a local branch or HEAD "
        "tracking an upstream starts from its fetched upstream, e.g. `origin/main`).",
    )


class SparseInfo(Result):
    """The main checkout's cone-mode sparse-checkout patterns, applied to the new checkout."""

    cone: bool = True
    patterns: list[str] = Field(default_factory=list, description="Directories checked out.")


class SubmoduleInfo(Result):
    path: str = Field(description="The submodule's path in the checkout.")
    status: Literal["initialized", "skipped", "failed"] = Field(
        description="initialized: cloned from the main checkout's copy (no network); skipped: "
        "not initialised in the main checkout; failed: see `error` (the checkout is usable)."
    )
    error: str | None = None
