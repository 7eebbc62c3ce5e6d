"""Python client for xumd: sync (`Client`) and async (`AsyncClient`), handshake built in."""

from xum_client.errors import DaemonNotRunning, XumRpcError
from xum_client.sync import Client, socket_path_for

__all__ = ["Client", "DaemonNotRunning", "XumRpcError", "socket_path_for"]
