"""The composition root's runtime: services, hooks, and the daemon's run/stop sequence.

Features (lifecycle, cleanup, processes, ...) install themselves with `install(app)`: they
register handlers on the router, provide their service object, and add hooks:
- `on_startup`: runs before readiness, in order (recovery lives here);
- `after_ready`: a background task started once the socket serves, cancelled at shutdown;
- `on_shutdown`: a drain, run with its own deadline after in-flight requests settled.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.abc

from xumd import __version__, logs
from xumd.config import DaemonConfig
from xumd.events import EventBus
from xumd.paths import RootPaths
from xumd.rpc.dispatch import Router
from xumd.rpc.server import Server
from xumd.sdnotify import Notifier
from xumd.store import Store

log = logs.get("xumd.app")

T = TypeVar("T")
Hook = Callable[[], Awaitable[None]]


@dataclass(slots=True)
class _Drain:
    name: str
    fn: Hook
    deadline_s: float


class App:
    def __init__(
        self, paths: RootPaths, config: DaemonConfig, store: Store, notifier: Notifier | None = None
    ) -> None:
        self.paths = paths
        self.config = config
        self.store = store
        self.notifier = notifier or Notifier(address="")
        self.events = EventBus()
        self.router = Router(stopping=lambda: self.stopping)
        self.server = Server(self.router, config)
        self.version = __version__
        self.socket_path = paths.socket
        self.started_at = time.time()
        self.stopping = False
        self.ready = False
        self.shutdown_requested = anyio.Event()
        self._services: dict[type[Any], Any] = {}
        self._startup: list[tuple[str, Hook]] = []
        self._background: list[tuple[str, Hook]] = []
        self._drains: list[_Drain] = []
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
        self._background.append((name, fn))

    def on_shutdown(self, name: str, fn: Hook, deadline_s: float | None = None) -> None:
        self._drains.append(_Drain(name, fn, deadline_s or self.config.drain_deadline_s))

    def request_shutdown(self, reason: str) -> None:
        if not self.shutdown_requested.is_set():
            log.info("daemon.shutdown_requested", reason=reason)
            self.shutdown_requested.set()

    # -- run -------------------------------------------------------------------------------------

    async def run(self) -> dict[str, list[str]]:
        """Serve until shutdown; returns what each drain left pending (for the exit log)."""
        pending: dict[str, list[str]] = {}
        async with anyio.create_task_group() as background:
            # Signals are handled from the first moment; startup steps (recovery) are
            # idempotent, so a stop requested during them simply takes effect after them.
            await background.start(self._watch_signals)
            for name, fn in self._startup:
                started = time.perf_counter()
                await fn()
                ms = round((time.perf_counter() - started) * 1000, 2)
                log.info("daemon.startup_step", step=name, ms=ms)
            async with anyio.create_task_group() as connections:
                async with anyio.create_task_group() as work:
                    accept = anyio.CancelScope()

                    async def accept_loop() -> None:
                        with accept:
                            await self.server.serve(connections, work)

                    connections.start_soon(accept_loop)
                    self.ready = True
                    self.notifier.ready(f"serving {self.paths.root}")
                    log.info("daemon.ready", root=str(self.paths.root), pid=os.getpid())
                    for name, fn in self._background:
                        background.start_soon(self._run_background, name, fn)
                    if self.notifier.watchdog_s:
                        background.start_soon(self._watchdog, self.notifier.watchdog_s)
                    await self.shutdown_requested.wait()
                    self.stopping = True
                    self.notifier.stopping()
                    accept.cancel()
                    with anyio.move_on_after(self.config.shutdown_grace_s) as grace:
                        await self.router.wait_idle()
                    if grace.cancelled_caught:
                        log.warning("daemon.requests_cancelled", active=self.router.active)
                    work.cancel_scope.cancel()
                for drain in self._drains:
                    left = await self._run_drain(drain)
                    if left:
                        pending[drain.name] = left
                # Give connections a moment to flush their last answers, then close them.
                with anyio.move_on_after(0.5):
                    while any(c for c in self.server.connections):
                        for conn in list(self.server.connections):
                            conn.close()
                        await anyio.sleep(0.01)
                connections.cancel_scope.cancel()
            background.cancel_scope.cancel()
        log.info("daemon.stopped", pending=pending)
        return pending

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

    async def _watchdog(self, interval_s: float) -> None:
        # Ping at half the interval, and only while the daemon is really healthy: the loop runs
        # (this task is scheduled) and the store answers.
        while True:
            if self.store.ping():
                self.notifier.watchdog()
            await anyio.sleep(interval_s / 2)
