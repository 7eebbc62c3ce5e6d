"""How the CLI reports a failure: one line of text on stderr, or with `--json` one JSON object
on stdout (`{"error": {code, kind, message, data, exit}}`), so a script parses one stream
whatever happened; the exit code is the same either way (docs in README.md, "Errors").

Light (no pydantic, no rich): it runs on the CLI's failure path.
"""

from __future__ import annotations

import json
from typing import Any

import click

from xum_client.errors import (
    ClientTimeout,
    ConnectionLost,
    DaemonNotRunning,
    HostError,
    VersionMismatch,
    XumClientError,
    XumRpcError,
)


def error_object(exc: BaseException, exit_code: int) -> dict[str, Any]:
    """The `--json` form of a failure: `code` is the JSON-RPC code for the daemon's errors
    (null for the CLI's own), `kind` the error kind (the daemon's, or `usage`, `no_daemon`,
    `connection_lost`, `client_timeout`, `version_mismatch`, `daemon_stopping`, `aborted`,
    `error`, and for `--host`: `host_unreachable`, `host_key_refused`, `host_key_unverified`,
    `xum_missing`, `bridge_failed`)."""
    code: int | None = None
    data: dict[str, Any] = {}
    if isinstance(exc, XumRpcError):
        code, kind, message = exc.code, exc.kind, exc.message
        data = {k: v for k, v in exc.data.items() if k != "kind"}
    elif isinstance(exc, DaemonNotRunning):
        kind, message = "no_daemon", str(exc)
        data = {"root": exc.root, "socket": exc.socket_path, "reason": exc.reason}
    elif isinstance(exc, click.UsageError):
        kind, message = "usage", exc.format_message()
    elif isinstance(exc, click.ClickException):
        # A command's own exception may name its kind (`xum run`: daemon_stopping).
        kind, message = str(getattr(exc, "kind", "error")), exc.format_message()
    elif isinstance(exc, ConnectionLost):
        kind, message = "connection_lost", str(exc)
        if exc.host is not None:
            # ssh's status and last line say why the link ended (killed, the host gone, the
            # host's daemon closing it), as a host that could not be reached at all does.
            data = {
                "host": exc.host,
                "method": exc.method,
                "outcome": "unknown" if exc.method is not None else None,
                "ssh_status": exc.status,
                "detail": exc.detail,
                **exc.extra,
            }
    elif isinstance(exc, HostError):
        kind, message = exc.kind, str(exc)
        data = {"host": exc.host, "ssh_status": exc.status, "detail": exc.detail}
    elif isinstance(exc, ClientTimeout):
        kind, message = "client_timeout", str(exc)
    elif isinstance(exc, VersionMismatch):
        kind, message, data = exc.kind, str(exc), dict(exc.data)
    elif isinstance(exc, click.exceptions.Abort):
        kind, message = "aborted", "aborted"
    else:
        # A client error may name its kind (a host's: `host_unreachable`, `xum_missing`, ...).
        kind, message = str(getattr(exc, "kind", None) or "error"), str(exc)
    return {"code": code, "kind": kind, "message": message, "data": data, "exit": exit_code}


def error_text(exc: XumClientError | click.ClickException) -> str:
    """One line, `xum: KIND: MESSAGE`: the kind `--json` gives (the daemon's, or the client's
    own: a host's, `connection_lost`, `no_daemon`, ...), then the message, which never repeats
    it."""
    found = error_object(exc, 0)
    return f"xum: {found['kind']}: {found['message']}"


def emit_json_error(exc: BaseException, exit_code: int) -> None:
    click.echo(json.dumps({"error": error_object(exc, exit_code)}, default=str))


def wants_json(argv: list[str]) -> bool:
    """`--json` among the CLI's own options (before a `--`: what follows is a command's argv),
    wherever it stands (before or after the command's name), whether click parsed it or not."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False
