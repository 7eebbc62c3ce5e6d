"""hello, daemon.status, daemon.shutdown, events.subscribe.

Served from the first moment, without the protocol's models loaded (docs/PERFORMANCE.md, "Copies
kept for speed": loading them made a lean start's first `hello` ~100 ms slower): `hello`'s and
`daemon.status`'s answers are written as their result models
would write them (tests/daemon/test_lean_start.py compares the bytes), their params in the common
valid shapes are read without the model (`lean_hello`, `lean_empty`), and each method's params model
is imported at its first request that needs it (`Router.add(params_from=...)`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson
from xum_protocol.errors import ErrorKind
from xum_protocol.method_names import METHOD_NAMES
from xum_protocol.version import PROTOCOL_VERSION, SUPPORTED_PROTOCOLS, parse_version

from xumd.app import App
from xumd.base.errors import XumError
from xumd.rpc.dispatch import Encoded, RequestContext
from xumd.system import platform

if TYPE_CHECKING:
    from pydantic import BaseModel
    from xum_protocol.models.daemon import EmptyParams, HelloParams, ShutdownResult
    from xum_protocol.models.events import Event, SubscribeParams, SubscribeResult


def _hello_params() -> type[BaseModel]:
    from xum_protocol.models.daemon import HelloParams

    return HelloParams


def _empty_params() -> type[BaseModel]:
    from xum_protocol.models.daemon import EmptyParams

    return EmptyParams


def _subscribe_params() -> type[BaseModel]:
    from xum_protocol.models.events import SubscribeParams

    return SubscribeParams


class LeanHello(NamedTuple):
    """`hello`'s params in their common valid shape, read without `HelloParams`."""

    protocol: str


class LeanEmpty(NamedTuple):
    """`EmptyParams`, read without the model."""


_EMPTY = LeanEmpty()


def lean_hello(raw: Any) -> LeanHello | None:
    """`{"protocol": "1.5", "client": {"name": ..., "version": ...}}` (client optional) within
    `HelloParams`' bounds, or None: the model reads (and refuses) every other shape."""
    if type(raw) is not dict or not raw.keys() <= {"protocol", "client"}:
        return None
    protocol = raw.get("protocol")
    if type(protocol) is not str or len(protocol) > HELLO_PROTOCOL_MAX:
        return None
    client = raw.get("client")
    if client is not None:
        if type(client) is not dict or not client.keys() <= {"name", "version"}:
            return None
        name, version = client.get("name"), client.get("version", "")
        if type(name) is not str or not 1 <= len(name) <= CLIENT_FIELD_MAX:
            return None
        if type(version) is not str or len(version) > CLIENT_FIELD_MAX:
            return None
    return LeanHello(protocol)


def lean_empty(raw: Any) -> LeanEmpty | None:
    """No params (absent, `{}` or `[]`), or None: the model refuses the rest."""
    return _EMPTY if raw is None or (type(raw) in (dict, list) and not raw) else None


HELLO_PROTOCOL_MAX = 32
CLIENT_FIELD_MAX = 200
"""`HelloParams.protocol`'s and `ClientInfo`'s length bounds (tests/daemon/test_lean_start.py checks
`lean_hello` against the model)."""


def hello_json(app: App, capabilities: list[str]) -> bytes:
    """`hello`'s result as `HelloResult` serialises it."""
    return orjson.dumps(
        {
            "protocol": PROTOCOL_VERSION,
            "server": {"name": "xumd", "version": app.version},
            "root": str(app.paths.root),
            "capabilities": capabilities,
            "pid": os.getpid(),
            "started_at": app.started_at,
            "epoch": app.events.epoch,
            "socket": str(app.socket_path),
        }
    )


def status_json(
    app: App, uptime_s: float, connections: int, stopping: bool, details: dict[str, Any]
) -> bytes:
    """`daemon.status`'s result as `DaemonStatusResult` serialises it."""
    return orjson.dumps(
        {
            "pid": os.getpid(),
            "root": str(app.paths.root),
            "version": app.version,
            "protocol": PROTOCOL_VERSION,
            "started_at": app.started_at,
            "uptime_s": uptime_s,
            "connections": connections,
            "shutting_down": stopping,
            "details": details,
        }
    )


def install(app: App) -> None:
    # hello's answer is the same for every client of this run (only the negotiation differs):
    # built once, again only if what it lists moved (a route registered after start-up).
    hello_key: tuple[object, ...] = ()
    hello_answer = Encoded(b"")

    def hello_result() -> Encoded:
        nonlocal hello_key, hello_answer
        key = (len(app.router.routes), os.getpid(), app.events.epoch, app.socket_path)
        if key != hello_key:
            capabilities = sorted(name for name in app.router.routes if name in METHOD_NAMES)
            hello_key, hello_answer = key, Encoded(hello_json(app, capabilities))
        return hello_answer

    async def hello(params: HelloParams | LeanHello, ctx: RequestContext) -> Encoded:
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
        return hello_result()

    status_answer = StatusAnswer(
        lambda uptime_s, connections, stopping, details: status_json(
            app, uptime_s, connections, stopping, details
        )
    )

    async def status(_: EmptyParams | LeanEmpty, ctx: RequestContext) -> Encoded:
        # Every part is read on every call (a provider's own memo keeps that cheap): only the
        # bytes are kept, and only while every part is what it was.
        details = {name: provider() for name, provider in app.status_providers.items()}
        return status_answer(
            round(time.monotonic() - app.started_monotonic, 3),
            len(app.server.connections),
            app.stopping,
            details,
        )

    async def shutdown(_: EmptyParams | LeanEmpty, ctx: RequestContext) -> ShutdownResult:
        # Answer first: the stop begins on the next loop turn, after this reply is queued.
        app.request_shutdown("daemon.shutdown")
        from xum_protocol.models.daemon import ShutdownResult

        return ShutdownResult(stopping=True)

    # One subscription per connection: a second subscribe replaces the first (a client that
    # resubscribes on the same connection, to resume or to change its types, would otherwise
    # get every event twice).
    subscriptions: dict[int, Callable[[], None]] = {}
    replay_limit = max(app.config.max_frame_bytes // 2, 1)

    async def subscribe(params: SubscribeParams, ctx: RequestContext) -> SubscribeResult:
        from xum_protocol.models.events import EVENT_NOTIFICATION, SubscribeResult

        prefixes = tuple(params.types) if params.types else None
        peer = ctx.peer

        def wanted(event: Event) -> bool:
            return prefixes is None or event.type.startswith(prefixes)

        def forward(event: Event) -> None:
            if wanted(event) and not peer.notify(EVENT_NOTIFICATION, event.model_dump(mode="json")):
                unsubscribe()

        def unsubscribe() -> None:
            stop()
            if subscriptions.get(peer.id) is unsubscribe:
                del subscriptions[peer.id]

        def attach() -> None:
            """After `stop` is set: on a connection already closed, on_close calls at once."""
            previous = subscriptions.pop(peer.id, None)
            if previous is not None:
                previous()
            subscriptions[peer.id] = unsubscribe
            peer.on_close(unsubscribe)
            peer.keep_streaming()

        # No await from here to the return: nothing published can fall between the snapshot
        # (or the replay) and the listener, and the answer is queued before any later event.
        epoch = app.events.epoch
        resync = False
        if params.after_seq is not None:
            missed = app.events.replay_after(params.after_seq) if params.epoch == epoch else None
            replay = [event for event in missed if wanted(event)] if missed is not None else None
            if replay is not None and _encoded_size(replay) <= replay_limit:
                stop = app.events.listen(forward)
                attach()
                return SubscribeResult(
                    epoch=epoch, seq=app.events.seq, snapshot=None, events=replay
                )
            resync = True
        seq, snapshot, rest = app.events.snapshot(params.snapshot_limit)
        stop = app.events.listen(forward)
        attach()
        return SubscribeResult(
            epoch=epoch,
            seq=seq,
            snapshot=snapshot,
            resync_required=resync,
            workspaces_next=rest.get("workspaces"),
        )

    if app.config.enable_test_methods:
        _install_test_methods(app)
    # Requests being handled right now (daemon.status itself included).
    app.status_providers["rpc"] = lambda: {"active": app.router.active}
    # The platform backend and what it cannot guarantee (fixed for the daemon's life).
    platform_status = platform.status()
    app.status_providers["platform"] = lambda: platform_status
    # Descriptor limits (soft and hard, the connection cap and what is open now).
    app.status_providers["fds"] = lambda: (
        app.server.limits.as_status() if app.server.limits is not None else {}
    )
    # These three read memory and return (no await): answered in the read callback, no task.
    app.router.add(
        "hello",
        hello,
        params_from=_hello_params,
        lean_params=lean_hello,
        allowed_while_stopping=True,
        inline=True,
    )
    app.router.add(
        "daemon.status",
        status,
        params_from=_empty_params,
        lean_params=lean_empty,
        allowed_while_stopping=True,
        inline=True,
    )
    app.router.add(
        "daemon.shutdown",
        shutdown,
        params_from=_empty_params,
        lean_params=lean_empty,
        allowed_while_stopping=True,
    )
    app.router.add("events.subscribe", subscribe, params_from=_subscribe_params, inline=True)


class StatusAnswer:
    """`daemon.status`'s answer as JSON bytes, rebuilt only when a part of it changed.

    Monitors poll it, and building and serialising the result model was most of a poll's
    cost. The caller reads every part on every call, so the bytes are reused only while each
    part compares equal to what they were built from: never older than what they show. That
    holds as long as a provider returns a new value when its value changes (never mutates a
    value it returned; the memos replace theirs). `uptime_s` moves on every call: it is
    spliced into the kept bytes (its first occurrence: it is serialised before `details`)."""

    _UPTIME = b'"uptime_s":'

    def __init__(self, build: Callable[[float, int, bool, dict[str, Any]], bytes]) -> None:
        self._build = build
        self._key: tuple[int, bool, dict[str, Any]] | None = None
        self._head = b""
        self._tail = b""

    def __call__(
        self, uptime_s: float, connections: int, stopping: bool, details: dict[str, Any]
    ) -> Encoded:
        key = (connections, stopping, details)
        if key != self._key:
            data = self._build(0.0, connections, stopping, details)
            at = data.index(self._UPTIME) + len(self._UPTIME)
            # The model writes 0.0 as `0.0`; whatever follows it is the rest of the object.
            if not data.startswith(b"0.0", at):
                raise ValueError("daemon.status: uptime_s is not where it was expected")
            self._head, self._tail = data[:at], data[at + 3 :]
            self._key = key
        return Encoded(b"".join((self._head, repr(float(uptime_s)).encode(), self._tail)))


def _encoded_size(events: list[Event]) -> int:
    """About the bytes `events` take in an answer (a replay too large for a client's frame cap
    is answered with a snapshot instead)."""
    return sum(len(orjson.dumps(event.model_dump(mode="json"))) + 1 for event in events)


def _install_test_methods(app: App) -> None:
    """`test.publish` (enable_test_methods only): publish events, for subscription tests."""
    # Test-method models: defined here, so pydantic loads only in a test daemon.
    from pydantic import BaseModel, ConfigDict, Field

    class _PublishParams(BaseModel):
        model_config = ConfigDict(extra="forbid", defer_build=True)
        type: str = Field(min_length=1, max_length=200)
        data: dict[str, Any] = Field(default_factory=dict)
        count: int = Field(default=1, ge=1, le=100_000)

    class _Published(BaseModel):
        model_config = ConfigDict(defer_build=True)
        seq: int

    async def publish(params: _PublishParams, ctx: RequestContext) -> _Published:
        for _ in range(params.count):
            event = app.events.publish(params.type, **params.data)
        return _Published(seq=event.seq)

    app.router.add("test.publish", publish, _PublishParams)
