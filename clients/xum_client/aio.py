"""Async client (anyio): one connection, concurrent calls matched by id, events as a stream.

    async with AsyncClient(root) as client:          # connects and says hello
        status = await client.status()               # a DaemonStatusResult
        result = await client.call("workspace.list", {"project": "prj_..."})  # a plain dict
        async with client.subscribe(["workspace."]) as events:
            print(events.snapshot)                    # SubscribeResult
            async for event in events:               # Event models, in sequence order
                ...

Reconnect-free on purpose: a lost connection fails every pending call with ConnectionLost and
the caller decides what to do (with `host=`, the message says the outcome is unknown and how to
look; events resume on a new client with `subscribe(after_seq=..., epoch=...)`). Errors are the
typed exceptions of `xum_client.errors`.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream
from pydantic import BaseModel
from xum_protocol import discovery, framing
from xum_protocol.models.daemon import DaemonStatusResult, HelloResult, ShutdownResult
from xum_protocol.models.events import EVENT_NOTIFICATION, Event, SubscribeResult
from xum_protocol.request_keys import FIELD

from xum_client.errors import (
    ClientTimeout,
    ConnectionLost,
    DaemonNotRunning,
    XumClientError,
)
from xum_client.sync import (
    check_release,
    check_reply,
    client_root,
    hello_params,
    release_context,
    with_request_key,
)

if TYPE_CHECKING:
    from xum_client.hosts import HostEntry
    from xum_client.sshlink import SshLink

M = TypeVar("M", bound=BaseModel)

MAX_FRAME = framing.DEFAULT_MAX_FRAME
NOTIFICATION_BUFFER = 1024
"""Events waiting for the caller; when full, the connection is dropped (never silent loss)."""


class _Pending:
    __slots__ = ("done", "reply")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.reply: Any = None


class EventStream:
    """The events of one subscription: `snapshot` (the subscribe answer) first, then Event
    models in order: on a resume, the replayed ones (`snapshot.events`), then live ones.

    `epoch` and `position` are what to resume from after a reconnect
    (`subscribe(after_seq=stream.position, epoch=stream.epoch)`): the sequence number the events
    handed out so far bring the client's state to."""

    def __init__(self, snapshot: SubscribeResult, receive: Any, after_seq: int | None) -> None:
        self.snapshot = snapshot
        self.epoch = snapshot.epoch
        self._replay = deque(snapshot.events)
        # A resume hands out the replay first: until then the state is at the client's after_seq.
        self.position = after_seq if self._replay and after_seq is not None else snapshot.seq
        self._receive = receive

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        if self._replay:
            event = self._replay.popleft()
            # Filtered out types leave gaps: after the last replayed event, the answer's seq.
            self.position = event.seq if self._replay else self.snapshot.seq
            return event
        while True:
            try:
                message = await self._receive.receive()
            except anyio.EndOfStream:
                raise StopAsyncIteration from None
            if message.get("method") == EVENT_NOTIFICATION:
                event = Event.model_validate(message.get("params") or {})
                self.position = event.seq
                return event


class AsyncClient:
    def __init__(
        self,
        root: Path | str | None = None,
        *,
        socket_path: Path | str | None = None,
        timeout: float | None = 60.0,
        handshake: bool = True,
        client_name: str = "xum-client",
        host: str | None = None,
        check_version: bool = True,
        retry_lost: bool = True,
    ) -> None:
        """`host`: a name from the hosts file (docs/HOSTS.md): the daemon on that machine,
        reached through `ssh ... xum bridge`; `root` and `socket_path` then name the host's.
        `retry_lost`: a mutating call whose connection was lost after it was sent is sent
        again once, with its request key, on a new connection (the sync client's rule)."""
        self.host = host
        self.retry_lost = retry_lost
        self._generation = 0
        """Counts the connections opened: a lost one is reopened once, by its first caller."""
        self._reopen_lock = anyio.Lock()
        self._host_entry: HostEntry | None = None
        self._link: SshLink | None = None
        if host is not None:
            from xum_client.hosts import get_host

            self._host_entry = get_host(host)
            self._host_root = str(root) if root is not None else None
            self._host_socket = str(socket_path) if socket_path is not None else None
            self.root = str(root or self._host_entry.remote_root or "")
            self.socket_path = str(socket_path or "")
        else:
            choice = discovery.resolve_socket(socket_path, root)
            self.root = client_root(root, choice)
            self.socket_path = str(choice.path)
        self.timeout = timeout
        self.server: HelloResult | None = None
        self._handshake = handshake
        self._client_name = client_name
        self._check_version = check_version
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._stream: anyio.abc.SocketStream | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._lost: str | None = None
        self._peer_ended = False
        self._noise: bytes | None = None
        self._send_lock = anyio.Lock()
        self._notify_send, self._notify_receive = anyio.create_memory_object_stream[dict[str, Any]](
            NOTIFICATION_BUFFER
        )

    # -- connection ------------------------------------------------------------------------

    @property
    def ssh_pid(self) -> int | None:
        """With `host=`: the pid of the ssh process that carries the connection."""
        return self._link.pid if self._link is not None else None

    async def _connect_host(self) -> anyio.abc.SocketStream:
        from xum_client.sshlink import SshLink

        assert self._host_entry is not None
        self._link = SshLink(self._host_entry, root=self._host_root, socket_path=self._host_socket)
        try:
            return await anyio.abc.UNIXSocketStream.from_socket(self._link.sock)
        except BaseException:
            link, self._link = self._link, None
            await anyio.to_thread.run_sync(link.close)
            raise

    async def __aenter__(self) -> AsyncClient:
        if self._host_entry is not None:
            self._stream = await self._connect_host()
            await self._start()
            if self.server is not None:
                self.root = self.server.root
                self.socket_path = self.server.socket or self.socket_path
            return self
        try:
            self._stream = await anyio.connect_unix(self.socket_path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            reason = "stale socket" if isinstance(exc, ConnectionRefusedError) else "no socket"
            raise DaemonNotRunning(self.root, self.socket_path, reason) from None
        except PermissionError:
            raise XumClientError(
                f"permission denied on {self.socket_path}: the daemon belongs to another user"
            ) from None
        except OSError as exc:
            raise DaemonNotRunning(self.root, self.socket_path, exc.strerror or str(exc)) from None
        await self._start()
        return self

    async def _start(self) -> None:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._reader)
        if self._handshake:
            try:
                self.server = await self.call_model(
                    "hello", hello_params(self._client_name), HelloResult
                )
                if self._check_version:
                    check_release(
                        self.server.model_dump(mode="json"), *release_context(self.root, self.host)
                    )
            except BaseException:
                await self.aclose()
                raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._tg is None:
            return
        tg, self._tg = self._tg, None
        tg.cancel_scope.cancel()
        await tg.__aexit__(None, None, None)
        if self._stream is not None:
            await self._stream.aclose()
        self._fail_pending("the client was closed")
        if self._link is not None:
            # ssh and its group are stopped and reaped (bounded by its grace periods).
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._link.close)

    def _fail_pending(self, reason: str) -> None:
        self._lost = self._lost or reason
        for pending in self._pending.values():
            pending.done.set()
        self._notify_send.close()

    async def _reader(self) -> None:
        assert self._stream is not None
        reader = BufferedByteReceiveStream(self._stream)
        try:
            while True:
                line = await reader.receive_until(framing.DELIMITER, MAX_FRAME)
                if not line.strip():
                    continue
                try:
                    message = framing.decode(line)
                except ValueError:
                    if self._link is not None and self.server is None:
                        # Before the first answer through ssh: the host's shell wrote it.
                        self._noise = line
                    raise
                if isinstance(message, dict) and "method" in message and "id" not in message:
                    try:
                        self._notify_send.send_nowait(message)
                    except anyio.WouldBlock:
                        self._fail_pending("too many unread events; the connection was dropped")
                        return
                    continue
                request_id = message.get("id") if isinstance(message, dict) else None
                pending = self._pending.get(request_id) if isinstance(request_id, int) else None
                if pending is not None:
                    pending.reply = message
                    pending.done.set()
                elif isinstance(message, dict) and "error" in message:
                    # id null: the daemon could not read a request; every waiter learns why.
                    for waiting in self._pending.values():
                        waiting.reply = message
                        waiting.done.set()
        except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError):
            self._peer_ended = True
            self._fail_pending("the daemon closed the connection")
        except (anyio.DelimiterNotFound, ValueError):
            self._fail_pending("the daemon sent an unreadable frame")
        except OSError as exc:
            self._fail_pending(f"connection error: {exc}")

    async def _reopen(self, generation: int) -> None:
        """A new connection in place of the lost one (`generation`), unless another call
        opened it already."""
        async with self._reopen_lock:
            if self._generation != generation:
                return
            await self.aclose()
            self._lost = None
            self._peer_ended = False
            self._noise = None
            self._link = None
            self._notify_send, self._notify_receive = anyio.create_memory_object_stream[
                dict[str, Any]
            ](NOTIFICATION_BUFFER)
            await self.__aenter__()
            self._generation += 1

    # -- calls -----------------------------------------------------------------------------

    async def call(
        self,
        method: str,
        params: Mapping[str, Any] | Sequence[Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Call `method`; returns its result object or raises the typed error. A mutating
        call carries a request key (the caller's, else a new one) and is sent again once
        on a new connection when its answer was lost after it was sent (`Client.call`)."""
        plain: dict[str, Any] | list[Any] | None = (
            dict(params)
            if isinstance(params, Mapping)
            else None
            if params is None
            else list(params)
        )
        keyed = with_request_key(method, plain)
        generation = self._generation
        try:
            return await self._call_once(method, keyed, timeout=timeout)
        except ConnectionLost as lost:
            if not (self.retry_lost and lost.sent and isinstance(keyed, dict) and FIELD in keyed):
                raise
            first = lost
        try:
            await self._reopen(generation)
        except (XumClientError, OSError):
            raise first from None  # no daemon to ask again: the outcome stays unknown
        return await self._call_once(method, keyed, timeout=timeout)

    async def _call_once(
        self,
        method: str,
        params: Mapping[str, Any] | Sequence[Any] | None,
        *,
        timeout: float | None,
    ) -> dict[str, Any]:
        if self._stream is None or self._tg is None:
            raise XumClientError("not connected: use `async with AsyncClient(...)`")
        if self._lost:
            raise ConnectionLost.during(method, False, self._lost)
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": request_id}
        if params is not None:
            message["params"] = dict(params) if isinstance(params, Mapping) else list(params)
        pending = self._pending[request_id] = _Pending()
        limit = self.timeout if timeout is None else timeout
        try:
            with anyio.fail_after(limit):
                async with self._send_lock:
                    await self._stream.send(framing.encode(message))
                await pending.done.wait()
        except TimeoutError:
            if self._link is not None and self.server is not None:
                from xum_client.sshlink import how_to_look

                raise ClientTimeout(
                    f"no answer from host {self.host!r} to {method} within {limit}s; the "
                    f"outcome is unknown: look with "
                    f"`{how_to_look(self._link.entry.name, method, params)}`"
                ) from None
            raise ClientTimeout(f"no answer to {method} within {limit}s") from None
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            # The daemon's end is closed: whatever part went out is never read as a request.
            raise ConnectionLost.during(method, False, "the daemon closed the connection") from None
        finally:
            self._pending.pop(request_id, None)
        if pending.reply is None:
            if self._link is not None and self._noise is not None:
                raise self._link.noise(self._noise)
            if self._link is not None and self._peer_ended and not self._link.closed:
                if method == "hello" and self.server is None:
                    # Only the handshake went out: ssh's status says why (no host, no key, no
                    # xum, no daemon), and nothing ran there.
                    raise await anyio.to_thread.run_sync(self._link.failure)
                raise await anyio.to_thread.run_sync(self._link.lost, method, params, True)
            raise ConnectionLost.during(method, True, self._lost or "the connection was lost")
        return check_reply(pending.reply, request_id)

    async def call_model(
        self,
        method: str,
        params: BaseModel | Mapping[str, Any] | None,
        result: type[M],
        *,
        timeout: float | None = None,
    ) -> M:
        """Typed call: params may be a protocol model; the result is validated as `result`."""
        raw = (
            params.model_dump(mode="json", exclude_none=True)
            if isinstance(params, BaseModel)
            else params
        )
        return result.model_validate(await self.call(method, raw, timeout=timeout))

    def iter_workspaces(
        self, filters: Mapping[str, Any] | None = None, page: int = 500
    ) -> AsyncIterator[dict[str, Any]]:
        """Every workspace (`filters`: `project_id`, `state`), `page` per `workspace.list`:
        `async for ws in client.iter_workspaces(): ...`."""
        from xum_client.paging import aiter_workspaces

        return aiter_workspaces(self.call, filters, page)

    async def status(self) -> DaemonStatusResult:
        return await self.call_model("daemon.status", None, DaemonStatusResult)

    async def shutdown(self) -> ShutdownResult:
        return await self.call_model("daemon.shutdown", None, ShutdownResult)

    @asynccontextmanager
    async def subscribe(
        self,
        types: list[str] | None = None,
        *,
        after_seq: int | None = None,
        epoch: str | None = None,
        snapshot_page: int | None = 500,
    ) -> AsyncIterator[EventStream]:
        """Subscribe on this connection; the stream ends when the connection does.

        To resume after a reconnect, pass the last stream's `position` and `epoch`: the answer
        then replays what was missed (the stream hands it out first), or says
        `resync_required` and carries a new snapshot (`stream.snapshot`).

        The snapshot's workspaces come `snapshot_page` per answer (protocol 1.3:
        `snapshot_limit`, then `workspace.list` pages on this connection; None: one answer), so
        a root of any size fits the frame cap; `stream.snapshot` is whole all the same. Events
        published meanwhile follow it (a later page may already show one: each `workspace.*`
        event carries the whole workspace, so applying it again is harmless)."""
        params: dict[str, Any] = {"types": types} if types is not None else {}
        if after_seq is not None or epoch is not None:
            params.update(after_seq=after_seq, epoch=epoch)
        if snapshot_page is not None:
            params["snapshot_limit"] = snapshot_page
        snapshot = await self.call_model("events.subscribe", params, SubscribeResult)
        if snapshot.workspaces_next is not None and snapshot.snapshot is not None:
            from xum_client.paging import aiter_workspaces

            workspaces = list(snapshot.snapshot.get("workspaces") or [])
            async for workspace in aiter_workspaces(
                self.call, None, snapshot_page or 500, after=snapshot.workspaces_next
            ):
                workspaces.append(workspace)
            snapshot = snapshot.model_copy(
                update={
                    "snapshot": {**snapshot.snapshot, "workspaces": workspaces},
                    "workspaces_next": None,
                }
            )
        yield EventStream(snapshot, self._notify_receive, after_seq)
