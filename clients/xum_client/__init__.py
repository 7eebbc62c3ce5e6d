"""Python client for xumd: sync (`Client`) and async (`AsyncClient`), handshake built in.

`AsyncClient` (anyio, pydantic models) is imported lazily, so `import xum_client` stays light for
the CLI. Both find the daemon by `resolve_socket` (the one rule, shared with the daemon and the
CLI: `xum_protocol.discovery`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xum_protocol.discovery import SocketChoice, resolve_socket

from xum_client.errors import (
    ClientTimeout,
    ConnectionLost,
    DaemonNotRunning,
    XumClientError,
    XumRpcError,
)
from xum_client.sync import Client, default_root, socket_path_for

if TYPE_CHECKING:
    from xum_client.aio import AsyncClient

__all__ = [
    "AsyncClient",
    "Client",
    "ClientTimeout",
    "ConnectionLost",
    "DaemonNotRunning",
    "SocketChoice",
    "XumClientError",
    "XumRpcError",
    "default_root",
    "resolve_socket",
    "socket_path_for",
]


def __getattr__(name: str) -> Any:
    if name == "AsyncClient":
        from xum_client.aio import AsyncClient

        return AsyncClient
    raise AttributeError(f"module 'xum_client' has no attribute {name!r}")
