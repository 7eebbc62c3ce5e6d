"""The daemon's one application error type: a kind from the protocol, a message, and data."""

from __future__ import annotations

from typing import Any

from xum_protocol.errors import ErrorKind


class XumError(Exception):
    """An error a client should see as a JSON-RPC error with `data.kind`."""

    def __init__(self, kind: ErrorKind, message: str, **data: Any) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.data = data

    def __repr__(self) -> str:
        return f"XumError({self.kind.value!r}, {self.message!r})"
