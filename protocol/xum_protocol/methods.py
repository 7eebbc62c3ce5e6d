"""The method table: name -> (params model, result model), gathered from the domain modules."""

from __future__ import annotations

from xum_protocol.methods_base import MethodSpec
from xum_protocol.models import (
    cleanup,
    daemon,
    events,
    gc,
    lease,
    process,
    project,
    recovery,
    turn,
    usage,
    workspace,
)

_DOMAINS = (
    daemon,
    project,
    workspace,
    usage,
    gc,
    cleanup,
    process,
    lease,
    turn,
    recovery,
    events,
)

METHODS: dict[str, MethodSpec] = {}
for _domain in _DOMAINS:
    for _spec in _domain.METHODS:
        if _spec.name in METHODS:
            raise RuntimeError(f"method {_spec.name} declared twice")
        METHODS[_spec.name] = _spec

__all__ = ["METHODS", "MethodSpec"]
