"""A keyed request's record, bound by its operation: a port between the operations and the
transport, below both.

The transport (`rpc.requestkeys`) makes a request named by a `request_key` current here while
its handler runs; the operation (a create, an archive) writes the key's record with its target
inside the transaction that commits its change (`bind_target`: the create's intent row, the
archive's `archived`), so the record and the change commit together or not at all: after a
crash a repeat of the call finds the target and answers from its state, or finds no record and
runs. The operations import this module, never the transport."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KeyedCall:
    method: str
    bind: Callable[[str], None]
    """Writes the key's record with its target, in the caller's open transaction."""


current: ContextVar[KeyedCall | None] = ContextVar("xumd_request_key", default=None)
"""The keyed request whose handler runs in this task (set and reset by the transport); None
for a request without a key."""


def bind_target(target: str, method: str) -> None:
    """Write the current keyed request's record with `target`, from inside the transaction that
    commits the operation's change. Only when the request is `method` (a create run by
    `turn.create` is not that request's); outside a keyed request, nothing."""
    call = current.get()
    if call is not None and call.method == method:
        call.bind(target)
