"""Typed client exceptions: one class per error kind, all carrying `kind`, `code` and `data`.

Light on purpose (no pydantic): the CLI imports it on its start-up path.
"""

from __future__ import annotations

from typing import Any

from xum_protocol.errors import ErrorKind


class XumClientError(Exception):
    """Anything the client raises."""


class DaemonNotRunning(XumClientError):
    """Nothing answers on the root's socket."""

    kind = "no_daemon"

    def __init__(self, root: str, socket_path: str, reason: str) -> None:
        super().__init__(
            f"no daemon on {root}; start it with `xum daemon run` or the systemd unit ({reason})"
        )
        self.root = root
        self.socket_path = socket_path
        self.reason = reason


class ConnectionLost(XumClientError):
    """The daemon closed the connection, or sent something that is not an answer.

    For a call in flight the outcome is unknown: the daemon may have done it (it finishes or
    rolls back an operation whose client left, as it does for any client). `host` and `method`
    say where and what, when known; `sent` whether the call's request went out (True: no
    answer came, the outcome is unknown; False: the daemon never saw it; None: not known, or
    not about one call). Through a host, `status` is ssh's exit status (negative: the signal
    that killed it; None: it had not exited) and `detail` the last line it wrote on stderr.
    The TypeScript client and the Neovim plugin say the same."""

    kind = "connection_lost"

    def __init__(
        self,
        message: str,
        *,
        host: str | None = None,
        method: str | None = None,
        sent: bool | None = None,
        status: int | None = None,
        detail: str = "",
        extra: dict[str, Any] | None = None,
    ):
        super().__init__(message)
        self.host = host
        self.method = method
        self.sent = sent
        self.status = status
        self.detail = detail
        self.extra = extra or {}
        """More of what the caller knows (`xum run`: the process, and whether it still runs)."""

    @classmethod
    def during(cls, method: str, sent: bool, reason: str) -> ConnectionLost:
        """The error of `method` when the connection ended (`reason`) before its answer."""
        if sent:
            message = (
                f"{method} was sent and the connection was lost before its answer ({reason}): "
                "the daemon may or may not have done it (it finishes or rolls back on its own); "
                "look before retrying"
            )
        else:
            message = (
                f"{method} was not sent: the connection was lost before the request went out "
                f"({reason}); the daemon never saw it"
            )
        return cls(message, method=method, sent=sent)


class HostError(XumClientError):
    """A host (`--host`, `Client(host=...)`) could not be reached: nothing ran there.

    `host` is its name, `status` ssh's exit status, `detail` the last line ssh (or the remote
    shell, or the bridge) wrote on stderr."""

    kind = "host_error"

    def __init__(self, message: str, *, host: str, status: int | None, detail: str) -> None:
        super().__init__(message)
        self.host = host
        self.status = status
        self.detail = detail


class HostUnreachable(HostError):
    """ssh could not reach the host (exit 255: refused, timed out, no route, name unknown)."""

    kind = "host_unreachable"


class HostKeyRefused(HostError):
    """The host refused every key ssh offered (exit 255, `Permission denied`)."""

    kind = "host_key_refused"


class HostKeyUnverified(HostError):
    """ssh could not verify the host's own key (unknown, or changed): exit 255."""

    kind = "host_key_unverified"


class XumMissingOnHost(HostError):
    """The host's shell found no xum (exit 127): install it there (`xum host install`)."""

    kind = "xum_missing"


class BridgeFailed(HostError):
    """`xum bridge` on the host reached no daemon (it says why)."""

    kind = "bridge_failed"


class ClientTimeout(XumClientError):
    """No answer within the client's timeout."""

    kind = "client_timeout"


class VersionMismatch(XumClientError):
    """The daemon's xum release differs from this client's in major.minor (`hello`'s
    `server.version`): raised by the client right after the handshake, never sent by a daemon.
    `kind` is `version_mismatch`; `data` names both versions and where the daemon runs."""

    kind = "version_mismatch"

    def __init__(self, client_version: str, server_version: str, where: str, hint: str) -> None:
        super().__init__(
            f"this client is xum {client_version} but the daemon {where} is xumd "
            f"{server_version}: their versions differ (major.minor); {hint}"
        )
        self.client_version = client_version
        self.server_version = server_version
        self.data = {
            "client_version": client_version,
            "server_version": server_version,
            "where": where,
        }


class XumRpcError(XumClientError):
    """A JSON-RPC error from the daemon: `kind` (e.g. 'not_found'), `code`, `message`, `data`."""

    kind: str
    code: int
    data: dict[str, Any]

    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data or {}
        self.kind = str(self.data.get("kind", "unknown"))


class ParseError(XumRpcError): ...


class InvalidRequest(XumRpcError): ...


class MethodNotFound(XumRpcError): ...


class InvalidParams(XumRpcError): ...


class InternalError(XumRpcError): ...


class NotFound(XumRpcError): ...


class Busy(XumRpcError): ...


class Conflict(XumRpcError): ...


class InvalidName(XumRpcError): ...


class InvalidScope(XumRpcError): ...


class NotSafe(XumRpcError): ...


class CleanupPending(XumRpcError): ...


class ShuttingDown(XumRpcError): ...


class ProtocolMismatch(XumRpcError): ...


class RpcTimeout(XumRpcError): ...


class FrameTooLarge(XumRpcError): ...


class InvalidState(XumRpcError): ...


class Untrusted(XumRpcError): ...


class OperationFailed(XumRpcError): ...


class InvalidPath(XumRpcError): ...


class PermissionDenied(XumRpcError): ...


class DiskFull(XumRpcError): ...


class FetchFailed(XumRpcError): ...


class PortsExhausted(XumRpcError): ...


ERROR_CLASSES: dict[str, type[XumRpcError]] = {
    ErrorKind.PARSE_ERROR: ParseError,
    ErrorKind.INVALID_REQUEST: InvalidRequest,
    ErrorKind.METHOD_NOT_FOUND: MethodNotFound,
    ErrorKind.INVALID_PARAMS: InvalidParams,
    ErrorKind.INTERNAL: InternalError,
    ErrorKind.NOT_FOUND: NotFound,
    ErrorKind.BUSY: Busy,
    ErrorKind.CONFLICT: Conflict,
    ErrorKind.INVALID_NAME: InvalidName,
    ErrorKind.INVALID_SCOPE: InvalidScope,
    ErrorKind.NOT_SAFE: NotSafe,
    ErrorKind.CLEANUP_PENDING: CleanupPending,
    ErrorKind.SHUTTING_DOWN: ShuttingDown,
    ErrorKind.PROTOCOL_MISMATCH: ProtocolMismatch,
    ErrorKind.TIMEOUT: RpcTimeout,
    ErrorKind.FRAME_TOO_LARGE: FrameTooLarge,
    ErrorKind.INVALID_STATE: InvalidState,
    ErrorKind.UNTRUSTED: Untrusted,
    ErrorKind.OPERATION_FAILED: OperationFailed,
    ErrorKind.INVALID_PATH: InvalidPath,
    ErrorKind.PERMISSION_DENIED: PermissionDenied,
    ErrorKind.DISK_FULL: DiskFull,
    ErrorKind.FETCH_FAILED: FetchFailed,
    ErrorKind.PORTS_EXHAUSTED: PortsExhausted,
}
_BY_KIND = ERROR_CLASSES  # the name earlier code used


def from_error_object(error: Any) -> XumRpcError:
    """The typed exception for a JSON-RPC error object (unknown kinds: XumRpcError)."""
    if not isinstance(error, dict):
        return XumRpcError(-32603, f"malformed error object: {error!r}")
    raw = error.get("data")
    data: dict[str, Any] = raw if isinstance(raw, dict) else {}
    cls = ERROR_CLASSES.get(str(data.get("kind")), XumRpcError)
    try:
        code = int(error.get("code", -32603))
    except (TypeError, ValueError):
        code = -32603
    return cls(code, str(error.get("message", "")), data)
