"""`xum mcp` under a real stdio MCP client (the Python SDK's), against a real daemon: at a
handshake revision (`agent`, `ClientSession.initialize`) or at 2026-07-28 (`modern`, the SDK's
`Client`, whose listen streams `events` reads)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.client.subscriptions import ServerEvent, Subscription

from tests.support.daemon import XUM, DaemonProcess


@dataclass
class Agent:
    """One MCP session with `xum mcp`, and the notifications it received, in order."""

    session: ClientSession
    received: MemoryObjectReceiveStream[Any]
    seen: list[Any] = field(default_factory=list)

    async def call(
        self, name: str, arguments: dict[str, Any] | None = None
    ) -> types.CallToolResult:
        result = await self.session.call_tool(name, arguments or {})
        assert isinstance(result, types.CallToolResult)
        return result

    async def ok(self, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """A call that must succeed: its structured result."""
        result = await self.call(name, arguments)
        assert not result.is_error, result.content
        assert isinstance(result.structured_content, dict)
        return result.structured_content

    async def error(self, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """A call that must be a tool error: its `error` object (kind, code, message, data)."""
        result = await self.call(name, arguments)
        assert result.is_error, result.structured_content
        # The error is text (the output schema is the result's): lines, then its JSON.
        assert result.structured_content is None
        text = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
        assert "Traceback" not in text
        error: dict[str, Any] = json.loads(text.splitlines()[-1])["error"]
        assert text.startswith(f"{error['kind']}: {error['message']}")
        return error

    def forget(self) -> None:
        """Drop every notification received so far."""
        self.seen.clear()
        while True:
            try:
                self.received.receive_nowait()
            except anyio.WouldBlock:
                return

    async def notified(self, match: Callable[[Any], bool], timeout: float = 15.0) -> Any:
        """The first notification (from now, or already received and unclaimed) that `match`es,
        within `timeout` seconds."""
        for index, message in enumerate(self.seen):
            if match(message):
                return self.seen.pop(index)
        with anyio.fail_after(timeout):
            while True:
                message = await self.received.receive()
                if match(message):
                    return message
                self.seen.append(message)


def updated(uri: str) -> Callable[[Any], bool]:
    return lambda m: isinstance(m, types.ResourceUpdatedNotification) and m.params.uri == uri


def list_changed(message: Any) -> bool:
    return isinstance(message, types.ResourceListChangedNotification)


def agent(
    daemon: DaemonProcess, *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> AbstractAsyncContextManager[Agent]:
    """`xum --root ROOT mcp` started by the SDK's stdio client, initialized."""
    return agent_with(["--root", str(daemon.root), "mcp"], cwd=cwd, env=env)


@asynccontextmanager
async def agent_with(
    args: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> AsyncIterator[Agent]:
    """`xum ARGS` (a command line ending with `mcp`) started by the SDK's stdio client."""
    send: MemoryObjectSendStream[Any]
    send, receive = anyio.create_memory_object_stream[Any](1000)

    async def on_message(message: Any) -> None:
        await send.send(message)

    async with (
        stdio_client(_server(args, cwd=cwd, env=env)) as (read, write),
        ClientSession(read, write, message_handler=on_message) as session,
    ):
        with anyio.fail_after(30):
            await session.initialize()
        yield Agent(session, receive)


def _server(
    args: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> StdioServerParameters:
    server_env = {k: v for k, v in os.environ.items() if k not in ("XUM_WORKSPACE_ID",)}
    server_env.update(env or {})
    return StdioServerParameters(
        command=XUM, args=args, env=server_env, cwd=str(cwd) if cwd is not None else None
    )


@asynccontextmanager
async def modern(daemon: DaemonProcess) -> AsyncIterator[Client]:
    """`xum --root ROOT mcp` under the SDK's `Client` in its default mode: it asks
    `server/discover` and speaks the newest revision both sides have (no response cache: every
    read is the server's). Each request (the discovery, a listen's acknowledgment) has 30 s."""
    server = _server(["--root", str(daemon.root), "mcp"])
    async with Client(server, cache=None, read_timeout_seconds=30) as client:
        yield client


async def events(
    subscription: Subscription, until: Callable[[ServerEvent], bool], timeout: float = 15.0
) -> list[ServerEvent]:
    """The events of a listen stream, in order, up to and with the first that `until` takes,
    within `timeout` seconds."""
    got: list[ServerEvent] = []
    with anyio.fail_after(timeout):
        async for event in subscription:
            got.append(event)
            if until(event):
                return got
    raise AssertionError(f"the listen stream ended after {got}")
