"""The composition root's runtime: services, hooks, and the daemon's run/stop sequence.

Features (lifecycle, cleanup, processes, ...) install themselves with `install(app)`: they
register handlers on the router, provide their service object, and add hooks:
- `on_startup`: runs in order before readiness, or, for features installed after it
  (`xumd.startup.lazy_start`), before their methods are answered (recovery lives here);
- `after_ready`: a background task started once the socket serves (for a feature installed
  later, once its startup steps ran), cancelled at shutdown;
- `on_shutdown`: a drain, run with its own deadline after in-flight requests settled.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.abc

from xumd import __version__
from xumd.base import faults, logs
from xumd.base.config import DaemonConfig
from xumd.base.events import EventBus
from xumd.base.paths import RootPaths
from xumd.rpc.dispatch import Router
from xumd.rpc.requestkeys import RequestKeys
from xumd.rpc.server import Server
from xumd.store import Store
from xumd.system import loop_exceptions, platform
from xumd.system.sdnotify import Notifier

log = logs.get("xumd.app")

CONNECTION_FLUSH_S = 1.0
"""At the end of a shutdown: how long connections get to flush their last answers."""
HARD_STOP_MARGIN_S = 5.0

RECONCILED = "XUM_RECONCILED=1"
"""The notify field sent once every record agrees with the disk (the startup passes ran): with
READY=1 where they ran before serving or had nothing to do, later on a start whose feature
graph is built after READY=1 (`xumd.startup.lazy_start`). Tests wait for it after READY=1."""


def _hard_exit(budget: float) -> None:
    # From a timer thread: the event loop may be stuck, so no logging framework here.
    os.write(2, f"xumd: shutdown exceeded its {budget:.1f}s budget; exiting now\n".encode())
    os._exit(EXIT_FORCED)


EXIT_FORCED = 70

HOLD_DRAINS = faults.declare(
    "daemon.shutdown.hold_drains",
    "simulate: hold a shutdown after in-flight requests ended (or were cancelled), before the "
    "drains, until the test releases it (faults.FaultPoint.hold)",
    simulate=True,
)

T = TypeVar("T")
Hook = Callable[[], Awaitable[None]]


@dataclass(slots=True)
class _Drain:
    name: str
    fn: Hook
    deadline_s: float
    stage: int = 50


@dataclass(frozen=True, slots=True)
class Mark:
    """`App.mark`: how many startup steps and background services there were, and which
    drains and services."""

    startup: int
    background: int
    drains: list[_Drain]
    services: dict[type[Any], Any]


class App:
    def __init__(
        self, paths: RootPaths, config: DaemonConfig, store: Store, notifier: Notifier | None = None
    ) -> None:
        self.paths = paths
        self.config = config
        self.store = store
        self.notifier = notifier or Notifier(address="")
        self.events = EventBus(config.event_ring_size, config.event_ring_bytes)
        self.router = Router(stopping=lambda: self.stopping, keys=RequestKeys(store))
        self.server = Server(self.router, config)
        self.version = __version__
        self.socket_path = paths.socket
        self.started_at = time.time()  # for display; durations use the monotonic clock
        self.started_monotonic = time.monotonic()
        self.stopping = False
        self.ready = False
        self.reconciling = False
        """A start that builds its feature graph after READY=1 (`reconcile_after_ready`)."""
        self.shutdown_requested = anyio.Event()
        self._services: dict[type[Any], Any] = {}
        self._startup: list[tuple[str, Hook]] = []
        self._background: list[tuple[str, Hook]] = []
        self._background_group: anyio.abc.TaskGroup | None = None
        self._drains: list[_Drain] = []
        self._hard_stop: threading.Timer | None = None
        self.status_providers: dict[str, Callable[[], Any]] = {}

    # -- composition ---------------------------------------------------------------------------

    def provide(self, service: T) -> T:
        self._services[type(service)] = service
        return service

    def get(self, cls: type[T]) -> T:
        service = self._services.get(cls)
        if service is None:
            raise LookupError(f"no {cls.__name__} installed")
        result: T = service
        return result

    def find(self, cls: type[T]) -> T | None:
        found: T | None = self._services.get(cls)
        return found

    def on_startup(self, name: str, fn: Hook) -> None:
        self._startup.append((name, fn))

    def after_ready(self, name: str, fn: Hook) -> None:
        """Add a background service. One added after readiness (a feature built at its first
        request) starts at `start_background`, once its feature is built whole."""
        self._background.append((name, fn))

    def mark(self) -> Mark:
        """What is registered now: for a feature installed after readiness, its startup steps
        and background services are those after the mark (or `rollback` forgets them)."""
        return Mark(
            len(self._startup), len(self._background), list(self._drains), dict(self._services)
        )

    def start_background(self, mark: Mark) -> None:
        """Start the background services added since `mark` (the daemon serves already)."""
        assert self._background_group is not None, "start_background before the daemon runs"
        for name, fn in self._background[mark.background :]:
            self._background_group.start_soon(self._run_background, name, fn)

    def rollback(self, mark: Mark) -> None:
        """Forget the startup steps, background services, drains and services added since
        `mark` (a feature whose build failed: the next build adds them again)."""
        del self._startup[mark.startup :]
        del self._background[mark.background :]
        self._drains[:] = mark.drains
        self._services.clear()
        self._services.update(mark.services)

    async def run_startup_steps(self, first: int = 0) -> None:
        """Run the startup steps from the `first`-th on, in order: all of them before readiness,
        or, for features installed after it (`xumd.startup.lazy_start`), theirs at their build."""
        for name, fn in self._startup[first:]:
            if not self.ready:  # after readiness systemd's status stays "serving"
                self.notifier.status(f"starting: {name}")
            started = time.perf_counter()
            await fn()
            ms = round((time.perf_counter() - started) * 1000, 2)
            log.info("daemon.startup_step", step=name, ms=ms)

    def on_shutdown(
        self, name: str, fn: Hook, deadline_s: float | None = None, *, stage: int = 50
    ) -> None:
        """Add a drain. Drains run by `stage` (lower first), then in registration order:
        the daemon's own processes stop (stage 10) before services that may be waiting on them
        (cleanup retry, stage 50) are drained."""
        self._drains.append(_Drain(name, fn, deadline_s or self.config.drain_deadline_s, stage))
        self._drains.sort(key=lambda d: d.stage)

    def request_shutdown(self, reason: str) -> None:
        if not self.shutdown_requested.is_set():
            log.info("daemon.shutdown_requested", reason=reason)
            self.shutdown_requested.set()

    # -- run -------------------------------------------------------------------------------------

    async def run(self) -> dict[str, list[str]]:
        """Serve until shutdown; returns what each drain left pending (for the exit log)."""
        pending: dict[str, list[str]] = {}
        loop_exceptions.install()
        async with anyio.create_task_group() as background:
            # Signals are handled from the first moment; startup steps (recovery) are
            # idempotent, so a stop requested during them simply takes effect after them.
            await background.start(self._watch_signals)
            self._background_group = background
            await self.run_startup_steps()
            async with anyio.create_task_group() as connections:
                async with anyio.create_task_group() as work:
                    accept = anyio.CancelScope()

                    async def accept_loop() -> None:
                        with accept:
                            await self.server.serve(connections, work)

                    connections.start_soon(accept_loop)
                    # The socket already listens (bound before the event loop started), so a
                    # client that connects now waits in the backlog: ready is true already.
                    self.ready = True
                    self.notifier.ready(f"serving {self.paths.root}")
                    log.info("daemon.ready", root=str(self.paths.root), pid=os.getpid())
                    if not self.reconciling:  # else both once the passes ran (lazy_start)
                        self.announce_reconciled()
                        self.release_startup_memory()
                    for name, fn in self._background:
                        background.start_soon(self._run_background, name, fn)
                    if self.notifier.watchdog_s:
                        background.start_soon(self._watchdog, self.notifier.watchdog_s)
                    await self.shutdown_requested.wait()
                    self._begin_stop()
                    # 1. Stop accepting: new clients get ECONNREFUSED from now on.
                    accept.cancel()
                    # 2. In-flight requests get the grace period to answer; new ones on open
                    # connections are refused with `shutting_down` by the router meanwhile.
                    with anyio.move_on_after(self.config.shutdown_grace_s) as grace:
                        await self.router.wait_idle()
                    if grace.cancelled_caught:
                        log.warning("daemon.requests_cancelled", active=self.router.active)
                    # Still running: cancelled. One that committed nothing answers
                    # `shutting_down`; one that committed its logical change answers its result
                    # with the physical part pending (requestcut.answer_if_cut, connection.py).
                    work.cancel_scope.cancel()
                # 3. Registered drains, each under its own deadline.
                await HOLD_DRAINS.hold()
                for drain in self._drains:
                    left = await self._run_drain(drain)
                    if left:
                        pending[drain.name] = left
                # 4. Connections: stop reading, flush what is queued, close; then force.
                await self._close_connections()
                connections.cancel_scope.cancel()
            background.cancel_scope.cancel()
        self._cancel_hard_stop()
        log.info("daemon.stopped", pending=pending)
        return pending

    def reconcile_after_ready(self) -> None:
        """This start runs its startup passes after READY=1 (`xumd.startup.lazy_start`):
        RECONCILED is sent, and the startup memory released, once they ran, not with READY=1."""
        self.reconciling = True

    def announce_reconciled(self) -> None:
        """Say (notify RECONCILED) that every record agrees with the disk."""
        self.notifier.send(RECONCILED, f"STATUS=serving {self.paths.root}")

    def release_startup_memory(self) -> None:
        """Give back what the startup passes held at their peak (a pass over 10,000 records
        peaks some 6 MiB above what the daemon keeps): their cyclic garbage, SQLite's page cache
        filled by the scans, and the C heap's free pages. Once, when the passes ran: right after
        READY=1 (it is not readiness work), before the first request is read; on a start whose
        feature graph is built after READY=1 with its passes, after they ran."""
        started = time.perf_counter()
        gc.collect()
        self.store.shrink_memory()
        trimmed = platform.current().release_free_heap()
        ms = round((time.perf_counter() - started) * 1000, 2)
        log.info("daemon.startup_memory_released", ms=ms, heap_trimmed=trimmed)

    def _begin_stop(self) -> None:
        self.stopping = True
        self.notifier.stopping()
        # Every step below has its own deadline; this is the backstop should a step ignore
        # cancellation (a blocking call in a thread, say): the process exits regardless.
        budget = (
            self.config.shutdown_grace_s
            + sum(d.deadline_s for d in self._drains)
            + CONNECTION_FLUSH_S
            + HARD_STOP_MARGIN_S
        )
        self._hard_stop = threading.Timer(budget, _hard_exit, args=(budget,))
        self._hard_stop.daemon = True
        self._hard_stop.start()
        log.info("daemon.stopping", budget_s=round(budget, 3), drains=len(self._drains))

    def _cancel_hard_stop(self) -> None:
        if self._hard_stop is not None:
            self._hard_stop.cancel()

    async def _close_connections(self) -> None:
        for conn in list(self.server.connections):
            conn.stop_reading()
        with anyio.move_on_after(CONNECTION_FLUSH_S):
            while self.server.connections:
                await anyio.sleep(0.01)
        for conn in list(self.server.connections):
            log.warning("daemon.connection_forced_closed", conn=conn.id, peer_pid=conn.pid)
            conn.close()

    async def _run_drain(self, drain: _Drain) -> list[str]:
        started = time.perf_counter()
        with anyio.move_on_after(drain.deadline_s) as scope:
            try:
                await drain.fn()
            except Exception:
                log.exception("daemon.drain_failed", drain=drain.name)
                return [f"{drain.name} failed"]
        ms = round((time.perf_counter() - started) * 1000, 2)
        if scope.cancelled_caught:
            log.warning("daemon.drain_deadline", drain=drain.name, deadline_s=drain.deadline_s)
            return [f"{drain.name} still pending after {drain.deadline_s}s"]
        log.info("daemon.drain_done", drain=drain.name, ms=ms)
        return []

    async def _run_background(self, name: str, fn: Hook) -> None:
        try:
            await fn()
        except Exception:
            # A background service must not take the daemon down; it is logged and stays down.
            log.exception("daemon.background_failed", service=name)

    async def _watch_signals(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async for signum in signals:
                if self.shutdown_requested.is_set():
                    log.warning("daemon.forced_exit", signal=signal.Signals(signum).name)
                    os._exit(128 + signum)
                self.request_shutdown(signal.Signals(signum).name)

    def healthy(self) -> str | None:
        """Why the daemon is not healthy, or None: the loop runs (we are called from it), the
        listener accepts (or we are stopping on purpose), and the store answers."""
        if not (self.server.serving or self.stopping):
            return "the listener is not accepting"
        try:
            if not self.store.ping():
                return "the store does not answer"
        except Exception as exc:
            return f"the store does not answer: {exc}"
        return None

    async def _watchdog(self, interval_s: float) -> None:
        # Ping three times per interval (systemd suggests at least two), and only while healthy:
        # a stuck loop or a dead listener stops the pings, and systemd restarts the daemon.
        while True:
            problem = self.healthy()
            if problem is None:
                self.notifier.watchdog()
            else:
                log.warning("daemon.unhealthy", reason=problem)
            await anyio.sleep(interval_s / 3)
