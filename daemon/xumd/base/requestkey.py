"""A keyed request's target: a port between the operations and the transport, below both.

The transport (`rpc.requestkeys`) makes a request named by a `request_key` current here while
its handler runs; an operation whose target is known only once it acts (the workspace a create
makes) names it inside the transaction that commits its intent (`bind_target`), so the key's
record and the operation's durable state commit together: after a crash a repeat of the call
finds the target and answers from its state. The operations import this module, never the
transport."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KeyedCall:
    method: str
    bind: Callable[[str], None]
    """Writes the target on the key's record, in the caller's open transaction."""


current: ContextVar[KeyedCall | None] = ContextVar("xumd_request_key", default=None)
"""The keyed request whose handler runs in this task (set and reset by the transport); None
for a request without a key."""


def bind_target(target: str, method: str) -> None:
    """Record `target` on the current keyed request, from inside the transaction that commits
    the operation's intent. Only when the request is `method` (a create run by `turn.create`
    is not that request's target); outside a keyed request, nothing."""
    call = current.get()
    if call is not None and call.method == method:
        call.bind(target)
