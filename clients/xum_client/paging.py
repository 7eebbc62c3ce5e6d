"""`workspace.list` page by page (protocol 1.2): every workspace, a bounded answer at a time.

Each page asks for `limit` workspaces after the previous page's `next` cursor; the listing ends
when an answer's `next` is null. The daemon pages by keyset on the listing order (creation
order, a number that only grows), so a workspace created or removed between pages neither repeats
nor hides another.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

DEFAULT_PAGE = 500
"""Workspaces per page: a few hundred KiB of answer, well under the frame cap."""


def page_params(filters: Mapping[str, Any] | None, limit: int, after: str | None) -> dict[str, Any]:
    if "limit" in (filters or {}) or "after" in (filters or {}):
        raise ValueError("pass the page size as `page`, not `limit`/`after` in the filters")
    params: dict[str, Any] = {**(filters or {}), "limit": limit}
    if after is not None:
        params["after"] = after
    return params


def _next(result: dict[str, Any], after: str | None) -> str | None:
    following = result.get("next")
    if following is None:
        return None
    if not isinstance(following, str):
        # Taken as the end, the listing would look complete with the rest of it missing.
        raise RuntimeError(f"workspace.list answered a `next` that is no cursor: {following!r}")
    if following == after:
        # A cursor that does not advance would loop for ever: never expected of a daemon.
        raise RuntimeError("workspace.list answered the same cursor twice")
    return following


def iter_workspaces(
    call: Callable[[str, dict[str, Any]], dict[str, Any]],
    filters: Mapping[str, Any] | None = None,
    page: int = DEFAULT_PAGE,
) -> Iterator[dict[str, Any]]:
    """Every workspace matching `filters` (`project_id`, `state`), one page per call."""
    after: str | None = None
    while True:
        result = call("workspace.list", page_params(filters, page, after))
        yield from result["workspaces"]
        after = _next(result, after)
        if after is None:
            return


async def aiter_workspaces(
    call: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]],
    filters: Mapping[str, Any] | None = None,
    page: int = DEFAULT_PAGE,
    after: str | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """`iter_workspaces` for the async client; `after`: from that cursor (a bounded
    snapshot's `workspaces_next`) instead of the start."""
    while True:
        result = await call("workspace.list", page_params(filters, page, after))
        for workspace in result["workspaces"]:
            yield workspace
        after = _next(result, after)
        if after is None:
            return
