"""xum's wire protocol: JSON-RPC 2.0 over NDJSON, typed with pydantic v2.

This package imports nothing from the daemon, so clients and plugins can depend on it alone.
"""

from xum_protocol.version import PROTOCOL_VERSION, SUPPORTED_PROTOCOLS

__all__ = ["PROTOCOL_VERSION", "SUPPORTED_PROTOCOLS"]
