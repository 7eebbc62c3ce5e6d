"""One view across hosts: the local daemon and every host in the hosts file, asked at once.

`gather(fn)` runs `fn(client)` against each target concurrently (one thread each: the blocking
client, ssh for a host) and returns one `HostAnswer` per target, in order (local first, then the
hosts by name): its result, or the error that target gave. A host that is down, refuses the key,
lacks xum or does not answer within the deadline is one answer with an error, never a failure of
the whole: the others are still shown (docs/HOSTS.md, "One view").

`HostEvents` subscribes to the events of several targets at once and hands out what happens on
each, tagged by host, in one stream: each target's events in its own order, reconnecting (with
`after_seq`/`epoch`, so nothing is missed or repeated while the daemon kept them) when its
connection drops.

Every wait has a deadline: a connection's hello and each call are bounded by `deadline_s` (the
client's timeout, which also ends the ssh of a host that does not answer), and `gather` stops
waiting for all of them at the deadline.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from xum_client.errors import ClientTimeout, ConnectionLost, HostError, XumClientError
from xum_client.hosts import load_hosts
from xum_client.sync import Client

T = TypeVar("T")

DEADLINE_S = 15.0
"""Per target: how long its connection (ssh included) and its call may take."""
GRACE_S = 2.0
"""Beyond the deadline, for a target's own timeout to fire and say so itself."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where to ask: `host` None is the local daemon (by `root`/`socket_path`, as any command),
    else a host's name from the hosts file."""

    host: str | None
    root: str | None = None
    socket_path: str | None = None

    @property
    def label(self) -> str:
        return self.host if self.host is not None else "local"


def targets(
    root: str | None = None,
    socket_path: str | None = None,
    *,
    include_local: bool = True,
    hosts: Sequence[str] | None = None,
) -> list[Target]:
    """The local daemon (unless not wanted), then every host of the hosts file (or `hosts`)."""
    names = sorted(load_hosts()) if hosts is None else list(hosts)
    found: list[Target] = [Target(None, root, socket_path)] if include_local else []
    return found + [Target(name) for name in names]


@dataclass(slots=True)
class HostAnswer(Generic[T]):
    target: Target
    result: T | None = None
    error: XumClientError | None = None
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


def connect(target: Target, timeout: float, client_name: str = "xum-all-hosts") -> Client:
    if target.host is None:
        return Client(
            target.root, socket_path=target.socket_path, timeout=timeout, client_name=client_name
        )
    return Client(None, host=target.host, timeout=timeout, client_name=client_name)


def gather(
    fn: Callable[[Client], T],
    where: Sequence[Target],
    deadline_s: float = DEADLINE_S,
) -> list[HostAnswer[T]]:
    """`fn(client)` on every target at once; one answer per target, in the order given."""
    answers = [HostAnswer[T](target) for target in where]

    def one(answer: HostAnswer[T]) -> None:
        started = time.monotonic()
        try:
            with connect(answer.target, deadline_s) as client:
                answer.result = fn(client)
        except XumClientError as exc:
            answer.error = exc
        except OSError as exc:
            answer.error = XumClientError(f"{answer.target.label}: {exc}")
        finally:
            answer.elapsed_s = round(time.monotonic() - started, 3)

    if not answers:
        return answers
    pool = ThreadPoolExecutor(max_workers=len(answers), thread_name_prefix="xum-host")
    try:
        futures = {pool.submit(one, answer): answer for answer in answers}
        _done, late = wait_futures(futures, timeout=deadline_s + GRACE_S)
        for future in late:
            answer = futures[future]
            # Its own client timeout ends it (and its ssh) shortly; it is not waited for here.
            answer.error = ClientTimeout(
                f"{answer.target.label}: no answer within {deadline_s:.0f}s"
            )
            answer.elapsed_s = round(deadline_s + GRACE_S, 3)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return answers


# -- events from several hosts -----------------------------------------------------------------


def failure_data(exc: XumClientError) -> dict[str, Any]:
    """What a `lost` or `error` item says: the message, the error's kind and, for a host's
    link, ssh's status and last line (why the link ended: killed, the host gone, its daemon
    closing)."""
    data: dict[str, Any] = {"error": str(exc), "kind": str(getattr(exc, "kind", None) or "error")}
    if isinstance(exc, HostError | ConnectionLost) and exc.host is not None:
        data.update(ssh_status=exc.status, detail=exc.detail)
    return data


@dataclass(frozen=True, slots=True)
class HostEvent:
    """What `HostEvents` hands out: `kind` is `subscribed` (`data`: the subscribe answer),
    `event` (`data`: the event), `lost` (it reconnects) or `error` (it also retries), whose
    `data` is `failure_data`: {"error": message, "kind"} and, for a host, "ssh_status" and
    "detail"."""

    host: str | None
    kind: str
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.host if self.host is not None else "local"


class HostEvents:
    """Events of several targets in one stream, tagged by host (`next()`; iterate; `close()`).

    Each target has a thread that subscribes, forwards its events and, when the connection
    ends, reports it and subscribes again after a pause (doubling up to `max_backoff_s`),
    resuming after the last event it handed out (`after_seq` with the `epoch`): the daemon
    replays what was missed, or says `resync_required` (the `subscribed` item's data)."""

    def __init__(
        self,
        where: Sequence[Target],
        types: Sequence[str] = (),
        *,
        deadline_s: float = DEADLINE_S,
        max_backoff_s: float = 10.0,
        buffer: int = 10_000,
    ) -> None:
        self._queue: queue.Queue[HostEvent] = queue.Queue(maxsize=buffer)
        self._stop = threading.Event()
        self._types = list(types)
        self._deadline_s = deadline_s
        self._max_backoff_s = max_backoff_s
        self._clients: dict[int, Client] = {}
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._follow, args=(t,), daemon=True, name=f"xum-ev-{t.label}")
            for t in where
        ]
        for thread in self._threads:
            thread.start()

    def _put(self, item: HostEvent) -> None:
        # A full buffer (a consumer that stopped reading) blocks this target only, and never
        # past close().
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def _follow(self, target: Target) -> None:
        after_seq: int | None = None
        epoch: str | None = None
        backoff = 0.25
        while not self._stop.is_set():
            client: Client | None = None
            try:
                client = connect(target, self._deadline_s, "xum-events")
                with self._lock:
                    if self._stop.is_set():
                        break
                    self._clients[threading.get_ident()] = client
                params: dict[str, Any] = {"types": self._types} if self._types else {}
                if after_seq is not None and epoch is not None:
                    params.update(after_seq=after_seq, epoch=epoch)
                answer = client.call("events.subscribe", params)
                epoch = str(answer.get("epoch"))
                after_seq = int(answer.get("seq", 0))
                self._put(HostEvent(target.host, "subscribed", answer))
                for replayed in answer.get("events") or []:
                    after_seq = int(replayed.get("seq", after_seq))
                    self._put(HostEvent(target.host, "event", replayed))
                backoff = 0.25
                # Events come when they come: no deadline on this read (close() ends it).
                client.set_timeout(None)
                while not self._stop.is_set():
                    message = client.next_notification()
                    if message.get("method") != "event":
                        continue
                    event = message.get("params") or {}
                    after_seq = int(event.get("seq", after_seq))
                    self._put(HostEvent(target.host, "event", event))
            except XumClientError as exc:
                if self._stop.is_set():
                    break
                kind = "lost" if after_seq is not None else "error"
                self._put(HostEvent(target.host, kind, failure_data(exc)))
            finally:
                with self._lock:
                    self._clients.pop(threading.get_ident(), None)
                if client is not None:
                    with contextlib.suppress(Exception):
                        client.close()
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self._max_backoff_s)

    def next(self, timeout: float | None = None) -> HostEvent:
        """The next item from any target; queue.Empty after `timeout` seconds."""
        return self._queue.get(timeout=timeout)

    def __iter__(self) -> HostEvents:
        return self

    def __next__(self) -> HostEvent:
        return self.next()

    def close(self, timeout: float = 10.0) -> None:
        """Stop every target's thread (their connections, ssh included, are closed)."""
        self._stop.set()
        with self._lock:
            clients = list(self._clients.values())
        for client in clients:
            client.interrupt()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> HostEvents:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


__all__ = [
    "HostAnswer",
    "HostEvent",
    "HostEvents",
    "Target",
    "gather",
    "targets",
]
