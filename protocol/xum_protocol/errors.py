"""Error codes and machine-readable kinds.

Standard JSON-RPC codes are used for transport-level problems; every application error carries a
code in -32000..-32099 and `data.kind`, so a client can branch on the kind and show the message.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class StdCode(IntEnum):
    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603


class ErrorKind(StrEnum):
    # Kinds that map to the standard codes.
    PARSE_ERROR = "parse_error"
    INVALID_REQUEST = "invalid_request"
    METHOD_NOT_FOUND = "method_not_found"
    INVALID_PARAMS = "invalid_params"
    INTERNAL = "internal"
    # Application kinds (docs/PROTOCOL.md, "Errors").
    NOT_FOUND = "not_found"
    BUSY = "busy"
    CONFLICT = "conflict"
    INVALID_NAME = "invalid_name"
    INVALID_SCOPE = "invalid_scope"
    NOT_SAFE = "not_safe"
    CLEANUP_PENDING = "cleanup_pending"
    SHUTTING_DOWN = "shutting_down"
    PROTOCOL_MISMATCH = "protocol_mismatch"
    TIMEOUT = "timeout"
    FRAME_TOO_LARGE = "frame_too_large"
    INVALID_STATE = "invalid_state"
    UNTRUSTED = "untrusted"
    OPERATION_FAILED = "operation_failed"
    INVALID_PATH = "invalid_path"
    PERMISSION_DENIED = "permission_denied"
    DISK_FULL = "disk_full"
    FETCH_FAILED = "fetch_failed"
    PORTS_EXHAUSTED = "ports_exhausted"


ERROR_CODES: dict[ErrorKind, int] = {
    ErrorKind.PARSE_ERROR: StdCode.PARSE_ERROR,
    ErrorKind.INVALID_REQUEST: StdCode.INVALID_REQUEST,
    ErrorKind.METHOD_NOT_FOUND: StdCode.METHOD_NOT_FOUND,
    ErrorKind.INVALID_PARAMS: StdCode.INVALID_PARAMS,
    ErrorKind.INTERNAL: StdCode.INTERNAL_ERROR,
    ErrorKind.NOT_FOUND: -32001,
    ErrorKind.BUSY: -32002,
    ErrorKind.CONFLICT: -32003,
    ErrorKind.INVALID_NAME: -32004,
    ErrorKind.INVALID_SCOPE: -32005,
    ErrorKind.NOT_SAFE: -32006,
    ErrorKind.CLEANUP_PENDING: -32007,
    ErrorKind.SHUTTING_DOWN: -32008,
    ErrorKind.PROTOCOL_MISMATCH: -32009,
    ErrorKind.TIMEOUT: -32010,
    ErrorKind.FRAME_TOO_LARGE: -32011,
    ErrorKind.INVALID_STATE: -32012,
    ErrorKind.UNTRUSTED: -32013,
    ErrorKind.OPERATION_FAILED: -32014,
    ErrorKind.INVALID_PATH: -32015,
    ErrorKind.PERMISSION_DENIED: -32016,
    ErrorKind.DISK_FULL: -32017,
    ErrorKind.FETCH_FAILED: -32018,
    ErrorKind.PORTS_EXHAUSTED: -32019,
}


def code_for(kind: ErrorKind) -> int:
    return ERROR_CODES[kind]
