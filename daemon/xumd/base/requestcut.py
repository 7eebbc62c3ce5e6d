"""The answer of a request cut at shutdown once its change is committed: a port between the
operations and the transport, below both.

The transport (`rpc.dispatch`) makes each request current here while its handler runs; an
operation (lifecycle, cleanup) says, once its logical change is committed, what the request
answers should it be cancelled from then on (`answer_if_cut`). The operations import this
module, never the transport.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pydantic import BaseModel


class CuttableRequest(Protocol):
    """The transport's request context, as far as a cut answer needs it."""

    method: str
    committed: Callable[[], BaseModel | None] | None


current: ContextVar[CuttableRequest | None] = ContextVar("xumd_request", default=None)
"""The request whose handler runs in this task (set and reset by the transport)."""


def answer_if_cut(build: Callable[[], BaseModel | None], method: str) -> None:
    """Say that the current request's logical change is committed (invariant 2: no false
    answer). Should the request be cancelled from here on (the shutdown grace ran out while its
    physical part, a teardown say, still ran), it is answered with `build()`, called then and
    without awaiting (so it reads the store as the cut left it), instead of `shutting_down`.

    `build` may return None: nothing was committed after all (the request answers
    `shutting_down`). Only when the request is `method`: an operation that runs inside
    another (each workspace of a `project.remove`) builds the wrong result for the outer
    request, which registers its own. Outside a request (a background task), this does
    nothing."""
    request = current.get()
    if request is not None and request.method == method:
        request.committed = build


def cut_reason(stopping: bool, subject: str = "it") -> str:
    """Why work was cut short, for the record it leaves: the shutdown grace ran out, or
    `subject` (the request, the lane) was cancelled."""
    return "the daemon is shutting down" if stopping else f"{subject} was cancelled"
