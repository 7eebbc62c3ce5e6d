"""hello, daemon.status, daemon.shutdown, events.subscribe."""

from __future__ import annotations

import os
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from xum_protocol.errors import ErrorKind
from xum_protocol.methods import METHODS
from xum_protocol.models.daemon import (
    DaemonStatusResult,
    EmptyParams,
    HelloParams,
    HelloResult,
    ServerInfo,
    ShutdownResult,
)
from xum_protocol.models.events import EVENT_NOTIFICATION, Event, SubscribeParams, SubscribeResult
from xum_protocol.version import PROTOCOL_VERSION, SUPPORTED_PROTOCOLS, parse_version

from xumd.app import App
from xumd.errors import XumError
from xumd.rpc.dispatch import RequestContext


def install(app: App) -> None:
    async def hello(params: HelloParams, ctx: RequestContext) -> HelloResult:
        try:
            major, _minor = parse_version(params.protocol)
        except ValueError as exc:
            raise XumError(ErrorKind.INVALID_PARAMS, str(exc)) from None
        speaks = [v for v in SUPPORTED_PROTOCOLS if parse_version(v)[0] == major]
        if not speaks:
            raise XumError(
                ErrorKind.PROTOCOL_MISMATCH,
                f"client speaks protocol {params.protocol}; this server speaks "
                f"{', '.join(SUPPORTED_PROTOCOLS)}",
                client_protocol=params.protocol,
                server_protocols=list(SUPPORTED_PROTOCOLS),
            )
        ctx.peer.protocol = speaks[-1]
        return HelloResult(
            protocol=PROTOCOL_VERSION,
            server=ServerInfo(name="xumd", version=app.version),
            root=str(app.paths.root),
            capabilities=sorted(name for name in app.router.routes if name in METHODS),
        )

    async def status(_: EmptyParams, ctx: RequestContext) -> DaemonStatusResult:
        details: dict[str, Any] = {}
        for name, provider in app.status_providers.items():
            details[name] = provider()
        return DaemonStatusResult(
            pid=os.getpid(),
            root=str(app.paths.root),
            version=app.version,
            protocol=PROTOCOL_VERSION,
            started_at=app.started_at,
            uptime_s=round(time.monotonic() - app.started_monotonic, 3),
            connections=len(app.server.connections),
            shutting_down=app.stopping,
            details=details,
        )

    async def shutdown(_: EmptyParams, ctx: RequestContext) -> ShutdownResult:
        # Answer first: the stop begins on the next loop turn, after this reply is queued.
        app.request_shutdown("daemon.shutdown")
        return ShutdownResult(stopping=True)

    async def subscribe(params: SubscribeParams, ctx: RequestContext) -> SubscribeResult:
        prefixes = tuple(params.types) if params.types else None
        peer = ctx.peer

        def forward(event: Event) -> None:
            wanted = prefixes is None or event.type.startswith(prefixes)
            if wanted and not peer.notify(EVENT_NOTIFICATION, event.model_dump(mode="json")):
                unsubscribe()

        # No await between the snapshot and the listener: nothing published can fall between.
        seq, snapshot = app.events.snapshot()
        unsubscribe = app.events.listen(forward)
        peer.on_close(unsubscribe)
        return SubscribeResult(epoch=app.events.epoch, seq=seq, snapshot=snapshot)

    if app.config.enable_test_methods:
        _install_test_methods(app)
    # Requests being handled right now (daemon.status itself included).
    app.status_providers["rpc"] = lambda: {"active": app.router.active}
    # Descriptor limits (soft and hard, the connection cap and what is open now).
    app.status_providers["fds"] = lambda: (
        app.server.limits.as_status() if app.server.limits is not None else {}
    )
    app.router.add("hello", hello, allowed_while_stopping=True)
    app.router.add("daemon.status", status, allowed_while_stopping=True)
    app.router.add("daemon.shutdown", shutdown, allowed_while_stopping=True)
    app.router.add("events.subscribe", subscribe)


class _PublishParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str = Field(min_length=1, max_length=200)
    data: dict[str, Any] = Field(default_factory=dict)
    count: int = Field(default=1, ge=1, le=100_000)


class _Published(BaseModel):
    seq: int


def _install_test_methods(app: App) -> None:
    """`test.publish` (enable_test_methods only): publish events, for subscription tests."""

    async def publish(params: _PublishParams, ctx: RequestContext) -> _Published:
        for _ in range(params.count):
            event = app.events.publish(params.type, **params.data)
        return _Published(seq=event.seq)

    app.router.add("test.publish", publish, _PublishParams)
