"""A minimal asyncio NDJSON client, used against xumd and the floor alike.

Both sides are driven by this very client, so the client's own cost is in both measurements and
cancels out of the factor as far as it can.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import orjson


class RpcError(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message", "error"))
        self.error = error
        data = error.get("data") or {}
        self.kind: str = str(data.get("kind", ""))


class Conn:
    """One connection; `call` is sequential (one request in flight), notifications are kept."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self.notifications: list[dict[str, Any]] = []

    @classmethod
    async def open(cls, path: Path, *, hello: bool = False) -> Conn:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=64 * 1024 * 1024)
        conn = cls(reader, writer)
        if hello:
            await conn.call("hello", {"protocol": "1.0", "client": {"name": "xum-bench"}})
        return conn

    async def read_message(self) -> Any:
        line = await self._reader.readline()
        if not line:
            raise ConnectionError("connection closed")
        return orjson.loads(line)

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self._writer.write(orjson.dumps(message) + b"\n")
        await self._writer.drain()
        while True:
            reply = await self.read_message()
            if isinstance(reply, dict) and "id" not in reply and "method" in reply:
                self.notifications.append(reply)
                continue
            if not isinstance(reply, dict) or reply.get("id") != request_id:
                raise ConnectionError(f"unexpected reply {reply!r} to request {request_id}")
            if "error" in reply:
                raise RpcError(reply["error"])
            return reply["result"]

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass
