"""Typed client exceptions: one class per error kind, all carrying `kind`, `code` and `data`."""

from __future__ import annotations

from typing import Any

from xum_protocol.errors import ErrorKind


class XumClientError(Exception):
    pass


class DaemonNotRunning(XumClientError):
    def __init__(self, root: str, socket_path: str, reason: str) -> None:
        super().__init__(
            f"no daemon on {root} ({reason}); start it with `xum daemon run` or the systemd unit"
        )
        self.root = root
        self.socket_path = socket_path


class ConnectionLost(XumClientError):
    pass


class XumRpcError(XumClientError):
    kind: str
    code: int
    data: dict[str, Any]

    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data or {}
        self.kind = str(self.data.get("kind", "unknown"))


class NotFound(XumRpcError):
    pass


class Busy(XumRpcError):
    pass


class Conflict(XumRpcError):
    pass


class InvalidParams(XumRpcError):
    pass


class ProtocolMismatch(XumRpcError):
    pass


class NotSafe(XumRpcError):
    pass


class RpcTimeout(XumRpcError):
    pass


_BY_KIND: dict[str, type[XumRpcError]] = {
    ErrorKind.NOT_FOUND: NotFound,
    ErrorKind.BUSY: Busy,
    ErrorKind.CONFLICT: Conflict,
    ErrorKind.INVALID_PARAMS: InvalidParams,
    ErrorKind.PROTOCOL_MISMATCH: ProtocolMismatch,
    ErrorKind.NOT_SAFE: NotSafe,
    ErrorKind.TIMEOUT: RpcTimeout,
}


def from_error_object(error: Any) -> XumRpcError:
    if not isinstance(error, dict):
        return XumRpcError(-32603, f"malformed error object: {error!r}")
    raw = error.get("data")
    data: dict[str, Any] = raw if isinstance(raw, dict) else {}
    cls = _BY_KIND.get(str(data.get("kind")), XumRpcError)
    return cls(int(error.get("code", -32603)), str(error.get("message", "")), data)
