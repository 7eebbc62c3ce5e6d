"""The MCP SDK's wiring: a low-level `Server` on stdin/stdout whose tools and resources are the
daemon's (`tools.py`, `resources.py`).

State is the daemon's alone. Each tool call opens its own connection (found by the usual rule:
`--socket`, `--root`, `XUM_SOCKET`, `XUM_ROOT`, the default root; or `--host`, through ssh) and
closes it when the call ends, so a command `run_command` started in the foreground goes with a
call the agent cancels, and a daemon restarted between two calls is simply found again. One
more connection, held for as long as the server runs, follows the daemon's event stream
(`watch.py`) and turns workspace events into resource notifications.

Both protocol eras are served on stdio (the SDK's `serve_dual_era_loop`: the agent's first
request decides). The watcher's changes go to one `Publisher`, whose bus each era's delivery
listens to: the handshake era's `Notifier` (the session, its `resources/subscribe`s) and each
2026-07-28 `subscriptions/listen` stream (`Listen`).
"""

from __future__ import annotations

import base64
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    SubscriptionBus,
)
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from xum_client.aio import AsyncClient
from xum_client.errors import NotFound, RpcTimeout, XumClientError
from xum_client.locate import acurrent
from xum_client.mcp import resources, tools
from xum_client.mcp.watch import watch
from xum_client.sync import CLIENT_VERSION

log = logging.getLogger("xum.mcp")

RESOURCE_NOT_FOUND = -32002
"""MCP's code for a resource URI the server does not know."""

WATCH_READY_S = 10.0
"""How long start-up waits for the event watcher's first subscription before serving: a change
an agent makes right after start-up is then always notified."""


class Daemon:
    """How to reach the daemon; a new connection per use."""

    def __init__(self, root: str | None, socket_path: str | None, host: str | None) -> None:
        self.root = root
        self.socket_path = socket_path
        self.host = host

    def client(self, timeout: float | None = 60.0) -> AsyncClient:
        return AsyncClient(
            self.root,
            socket_path=self.socket_path,
            host=self.host,
            timeout=timeout,
            client_name="xum-mcp",
        )

    async def call(
        self, method: str, params: dict[str, Any] | None = None, timeout: float | None = 60.0
    ) -> dict[str, Any]:
        async with self.client(timeout) as client:
            return await client.call(method, params or {})


# -- change notifications ---------------------------------------------------------------------


class Publisher:
    """The one fan-out of what the watcher says: events on the SDK's subscription bus. Each era's
    delivery is a listener on it that filters for its agent: the handshake session's `Notifier`,
    and each 2026-07-28 `subscriptions/listen` stream (the SDK's `ListenHandler`)."""

    def __init__(self, bus: SubscriptionBus, interest: resources.Interest) -> None:
        self.bus = bus
        self.interest = interest

    async def changed(self, change: resources.Change) -> None:
        if change.list_changed:
            await self.bus.publish(ResourcesListChanged())
        for uri in change.uris:
            await self.bus.publish(ResourceUpdated(uri))

    async def everything(self) -> None:
        await self.changed(self.interest.everything())


class Notifier:
    """The handshake era's delivery: `notifications/resources/list_changed`, and `updated` for
    the resources subscribed, to the one session a request came on (notifications go to it
    outside any request). Events wait here deduplicated (each says "read it again"), so the bus
    never waits for the agent and what waits is at most one entry per resource."""

    def __init__(self, interest: resources.Interest) -> None:
        self.session: ServerSession | None = None
        self.interest = interest
        self._pending: dict[ServerEvent, None] = {}
        self._wake = anyio.Event()

    def seen(self, ctx: ServerRequestContext[Any]) -> None:
        """Remember a handshake session; a 2026-07-28 one gets these on its listen streams."""
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            self.session = ctx.session

    def deliver(self, event: ServerEvent) -> None:
        """The bus's listener (synchronous: it only queues)."""
        if self.session is None:
            return
        if isinstance(event, ResourceUpdated) and event.uri not in self.interest.subscribed:
            return
        if isinstance(event, ResourceUpdated | ResourcesListChanged):
            self._pending[event] = None
            self._wake.set()

    async def run(self) -> None:
        """Send what waits, in order, for as long as the server runs."""
        while True:
            if not self._pending:
                await self._wake.wait()
                self._wake = anyio.Event()
                continue
            event = next(iter(self._pending))
            del self._pending[event]
            session = self.session
            if session is None:
                continue
            try:
                if isinstance(event, ResourceUpdated):
                    await session.send_resource_updated(event.uri)
                else:
                    await session.send_resource_list_changed()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                # The agent went away: the server is ending; nothing to tell.
                self.session = None
                self._pending.clear()


class Listen:
    """`subscriptions/listen` (2026-07-28): the SDK's handler, asked only for what xum sends
    (the resource kinds: its tools and prompts never change, so the acknowledgment leaves them
    out), with the stream's URIs in the `Interest` while it is open."""

    def __init__(self, bus: SubscriptionBus, interest: resources.Interest) -> None:
        self.handler = ListenHandler(bus)
        self.interest = interest

    async def __call__(
        self, ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        asked = params.notifications
        served = types.SubscriptionFilter(
            resources_list_changed=asked.resources_list_changed,
            resource_subscriptions=asked.resource_subscriptions,
        )
        with self.interest.listening(asked.resource_subscriptions or ()):
            return await self.handler(ctx, params.model_copy(update={"notifications": served}))


# -- tools ------------------------------------------------------------------------------------


async def _run_command(daemon: Daemon, args: dict[str, Any]) -> tools.RunCommandResult:
    """Spawn in the foreground (bound to this call's connection), wait with the deadline, stop
    it if it still runs, and keep the last `max_bytes` bytes of its output."""
    wait_s = float(args["timeout_s"])
    max_bytes = int(args["max_bytes"])
    async with daemon.client(timeout=wait_s + 60.0) as client:
        spawn: dict[str, Any] = {k: args[k] for k in ("workspace_id", "argv", "env") if k in args}
        process = (
            await client.call("process.spawn", {**spawn, "kind": "exec", "foreground": True})
        )["process"]
        pid = process["id"]
        try:
            waited = await client.call("process.wait", {"process_id": pid, "timeout_s": wait_s})
            process, timed_out = waited["process"], False
        except RpcTimeout:
            # Still running at the deadline: stopped (SIGTERM, grace, SIGKILL of its tree).
            process = (await client.call("process.stop", {"process_id": pid}))["process"]
            timed_out = True
        tail = b""
        omitted = 0
        since = 0
        while True:
            # base64: the bytes as written, so the counts and the cut are exact (the text is
            # decoded once, at the end).
            page = await client.call(
                "process.output",
                {"process_id": pid, "since": since, "max_bytes": max_bytes, "encoding": "base64"},
            )
            data = base64.b64decode(page["data"])
            omitted += page["dropped"]
            if not data and page["next"] == since:
                break
            tail += data
            if len(tail) > max_bytes:
                omitted += len(tail) - max_bytes
                tail = tail[-max_bytes:]
            since = page["next"]
    return tools.RunCommandResult.model_validate(
        {
            "process": process,
            "exit": process.get("exit"),
            "timed_out": timed_out,
            "output": tail.decode(errors="replace"),
            "output_bytes": since,
            "output_omitted": omitted,
        }
    )


async def call_tool(daemon: Daemon, name: str, given: dict[str, Any] | None) -> tools.Outcome:
    tool = tools.TOOLS.get(name)
    if tool is None:
        return tools.unknown_tool(name)
    try:
        args = tools.arguments(tool, given)
        if tool.name == "run_command":
            return tools.ran(await _run_command(daemon, args))
        if tool.name == "current_workspace":
            if daemon.host is not None and not os.environ.get("XUM_WORKSPACE_ID"):
                raise NotFound(
                    -32001,
                    f"through --host {daemon.host} the current directory is not the host's: "
                    "set XUM_WORKSPACE_ID",
                    {"kind": "not_found"},
                )
            async with daemon.client() as client:
                result = await acurrent(client.call, os.getcwd(), os.environ)
        else:
            assert tool.method is not None
            result = await daemon.call(tool.method, args, tool.timeout_s or 60.0)
    except Exception as exc:
        if not isinstance(exc, XumClientError):
            log.exception("tool %s", name)
        return tools.failure(exc)
    return tools.success(result)


# -- the server -------------------------------------------------------------------------------


def _tool_entry(tool: tools.Tool) -> types.Tool:
    return types.Tool(
        name=tool.name,
        title=tool.title,
        description=tool.description,
        input_schema=tool.input_schema(),
        output_schema=tool.output_schema(),
        annotations=types.ToolAnnotations.model_validate(tool.annotations()),
    )


def build(daemon: Daemon, notifier: Notifier, listen: Listen) -> Server[Any]:
    listed = [_tool_entry(tool) for tool in tools.TOOLS.values()]

    async def list_tools(
        ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        notifier.seen(ctx)
        return types.ListToolsResult(tools=listed)

    async def on_call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        notifier.seen(ctx)
        outcome = await call_tool(daemon, params.name, params.arguments)
        return types.CallToolResult(
            content=[types.TextContent(text=outcome.text)],
            structured_content=None if outcome.is_error else outcome.structured,
            is_error=outcome.is_error,
        )

    async def list_resources(
        ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        notifier.seen(ctx)
        entries = [
            types.Resource(
                uri=resources.LIST_URI,
                name="workspaces",
                description="Every workspace, with its state and last cleanup.",
                mime_type=resources.MIME,
            )
        ]
        try:
            async with daemon.client() as client:
                async for workspace in client.iter_workspaces():
                    entries.append(types.Resource(**resources.resource_entry(workspace)))
        except XumClientError as exc:
            raise MCPError(tools.INTERNAL_ERROR, f"{exc}") from None
        return types.ListResourcesResult(resources=entries)

    async def list_templates(
        ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        notifier.seen(ctx)
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    uri_template=resources.WORKSPACE_TEMPLATE,
                    name="workspace",
                    description="One workspace's status (as show_workspace answers).",
                    mime_type=resources.MIME,
                )
            ]
        )

    async def read_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        notifier.seen(ctx)
        uri = str(params.uri)
        ws_id = resources.workspace_id_of(uri)
        if uri != resources.LIST_URI and ws_id is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"no resource {uri!r}", {"uri": uri})
        try:
            if ws_id is None:
                result = await daemon.call("workspace.list")
            else:
                result = await daemon.call("workspace.get", {"workspace_id": ws_id})
        except XumClientError as exc:
            outcome = tools.failure(exc)
            code = RESOURCE_NOT_FOUND if isinstance(exc, NotFound) else tools.INTERNAL_ERROR
            raise MCPError(code, outcome.text, outcome.structured["error"]) from None
        text = tools.success(result).structured
        return types.ReadResourceResult(
            contents=[
                types.TextResourceContents(
                    uri=uri, mime_type=resources.MIME, text=tools.to_json(text)
                )
            ]
        )

    async def subscribe(
        ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        notifier.seen(ctx)
        notifier.interest.subscribed.add(str(params.uri))
        return types.EmptyResult()

    async def unsubscribe(
        ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        notifier.seen(ctx)
        notifier.interest.subscribed.discard(str(params.uri))
        return types.EmptyResult()

    server: Server[Any] = Server(
        "xum",
        version=CLIENT_VERSION,
        instructions="xum's workspaces: each agent works in its own checkout. "
        "current_workspace says which one this is.",
        on_list_tools=list_tools,
        on_call_tool=on_call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
        on_subscriptions_listen=listen,
    )

    async def discover(
        ctx: ServerRequestContext[Any], _params: types.RequestParams
    ) -> types.DiscoverResult:
        # The SDK derives every `listChanged` from `subscriptions/listen` being served; xum's
        # tools never change, so only the resources' are said (as the handshake says them).
        capabilities = server.get_capabilities(protocol_version=ctx.protocol_version)
        if capabilities.tools is not None:
            no_changes = capabilities.tools.model_copy(update={"list_changed": False})
            capabilities = capabilities.model_copy(update={"tools": no_changes})
        return types.DiscoverResult(
            supported_versions=list(MODERN_PROTOCOL_VERSIONS),
            capabilities=capabilities,
            instructions=server.instructions,
        )

    server.add_request_handler("server/discover", types.RequestParams, discover)
    return server


@asynccontextmanager
async def _watching(
    daemon: Daemon, publisher: Publisher, notifier: Notifier
) -> AsyncIterator[None]:
    async with anyio.create_task_group() as tg:
        ready = anyio.Event()
        tg.start_soon(notifier.run)
        tg.start_soon(watch, daemon.client, publisher, ready)
        with anyio.move_on_after(WATCH_READY_S):
            await ready.wait()
        try:
            yield
        finally:
            tg.cancel_scope.cancel()


async def _serve(daemon: Daemon) -> None:
    interest = resources.Interest()
    bus = InMemorySubscriptionBus()
    notifier = Notifier(interest)
    bus.subscribe(notifier.deliver)
    server = build(daemon, notifier, Listen(bus, interest))
    # What the handshake era is told; a 2026-07-28 agent asks `server/discover` (above).
    options = server.create_initialization_options(NotificationOptions(resources_changed=True))
    publisher = Publisher(bus, interest)
    async with (
        _watching(daemon, publisher, notifier),
        stdio_server() as (read_stream, write_stream),
    ):
        await server.run(read_stream, write_stream, options)


def serve(*, root: str | None, socket_path: str | None, host: str | None) -> None:
    """Serve MCP on stdin/stdout until the agent closes stdin."""
    # stdout is the protocol's; anything said for a person goes to stderr.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="xum mcp: %(message)s")
    anyio.run(_serve, Daemon(root, socket_path, host))
