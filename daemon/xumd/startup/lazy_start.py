"""The feature graph built after READY=1: a lean start, and a start with records.

Time to ready is almost all imports (docs/PERFORMANCE.md, "Lean start"), and most of them are
the features' (lifecycle, cleanup, processes, turns, usage, recovery, gc). Either way the
daemon's own features are installed before READY=1 and the features' methods are registered by
name only (`Router.add_pending`: `hello` lists them, each refuses bad params with the same errors
once built).

- **Lean** (a root whose store holds no record and whose state directories are empty or
  absent: the startup passes have nothing to do): the graph is built at the first request that
  names one of its methods. The containment sweep is the daemon's own feature here and runs
  before READY=1.
- **At once** (a root with records): the graph is built by a background service started right
  after READY=1 (its imports in a worker thread, so `hello` is answered meanwhile), the
  containment with it (its sweep adopts what a live lease names). Until its startup passes
  ran, every method of the graph waits, and so do `daemon.status` and `events.subscribe`
  (`PARKED`: what they show is the records); `hello` and `daemon.shutdown` are answered. The
  notify field `xumd.app.RECONCILED` says when the passes ran. Why this keeps the contract:
  docs/RELIABILITY.md, "Start-up with records".

The build runs on the event loop: the installs synchronously (nothing interleaves), then the
startup steps the features added (containment sweep, adoption, recovery; on a lean start on a
store that still holds nothing), then their background services start (cleanup retry). The
graph's routes are put in place only after its steps ran: a request that arrives meanwhile
waits for the same build (at most `lock_wait_s`, then `timeout`). A build that fails is logged
and answered `internal`; what it registered is taken back, and the next request builds again.
A stop during the start-up build lets it finish its steps first (a stage-0 drain).

Until a lean build, `daemon.status` shows each feature's details, and `events.subscribe`'s
snapshot each feature's part, as that feature shows them on an empty root (`idle_details`,
`add_idle_snapshot`; tests/daemon/test_lean_start.py compares them with the built features'),
so that neither waits for the build (docs/PERFORMANCE.md, "Copies kept for speed").
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.method_names import METHOD_NAMES

from xumd.app import App
from xumd.base import faults, logs
from xumd.base.errors import XumError

log = logs.get("xumd.startup.lazy_start")

BOOKKEEPING_TABLES = frozenset({"meta", "workspace_listing_counter", "request_keys"})
"""Tables whose rows say nothing about workspaces, processes or work left (the schema version,
a counter, the request keys: a keyed call a crash cut left its work in the other tables). A row
in any other table, one added later included, means a full start."""

STATE_DIRS = ("workspaces", "trash", "archive", "processes")
"""Directories under the root where the features keep checkouts, deferred deletions, archived
copies and durable process output: anything in one (a stray, a partial copy) is theirs to
find before serving."""

FEATURE_TEST_METHODS = ("test.clock_advance",)
"""The methods outside the protocol's table the feature graph registers, with
`enable_test_methods` only: pending too on a lean start."""

BUILD_FAILS = faults.declare(
    "lazy_start.build_fails",
    "simulate: the first build of the feature graph in this daemon fails as a failed import "
    "would (answered internal; the next request builds it)",
    simulate=True,
)
_fault_spent = False

HOLD_BUILD = faults.declare(
    "lazy_start.hold_build",
    "simulate: hold the start-up build of a root with records after READY=1, its features "
    "installed, before their startup passes, until the test releases it "
    "(faults.FaultPoint.hold): the window in which requests wait",
    simulate=True,
)

PARKED = ("daemon.status", "events.subscribe")
"""The daemon's own methods that wait for a build at once: their answers show the records."""


def idle_details(app: App) -> dict[str, Callable[[], Any]]:
    """`daemon.status` details of the features not built yet: what each shows on an empty
    root, in the order they are installed (the built features replace them in place)."""
    cleanup = {"pending": 0, "abandoned": 0, "oldest": None}
    lifecycle: dict[str, Any] = {"closed": {}, "shared": {}, "directories": []}
    processes = {
        "running": 0,
        "pending_stop": 0,
        "leases": 0,
        "keep_processes": app.config.processes.keep_processes,
        "kept_at_stop": 0,
    }
    recovery = {
        "interrupted": 0,
        "strays": 0,
        "last_pass": {
            "rows": 0,
            "actions": {},
            "interrupted_now": 0,
            "missing_checkouts": 0,
            "turns": {"opened": 0, "failed": 0},
            "ms": 0.0,
        },
    }
    gc = {"budget": "not checked yet" if app.config.gc.budgeted() else "off"}
    return {
        "cleanup": lambda: cleanup,
        "lifecycle": lambda: lifecycle,
        "processes": lambda: processes,
        "recovery": lambda: recovery,
        "gc": lambda: gc,
    }


def add_idle_snapshot(app: App) -> None:
    """`events.subscribe`'s snapshot parts of the features not built yet, as they show an
    empty root, in the order they are installed (the built features replace them in place)."""
    app.events.add_snapshot_provider("projects", list)
    app.events.add_paged_snapshot_provider("workspaces", list, lambda limit: ([], None))
    app.events.add_snapshot_provider("processes", list)


def why_not_lean(app: App) -> str | None:
    """Why this root needs its features before serving (a record, a state directory with
    something in it), or None: nothing to adopt, recover or reclaim."""
    tables = [
        row["name"]
        for row in app.store.all(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    for table in tables:
        if table in BOOKKEEPING_TABLES:
            continue
        if app.store.one(f'SELECT 1 FROM "{table}" LIMIT 1') is not None:
            return f"records in {table}"
    for name in STATE_DIRS:
        try:
            with os.scandir(app.paths.root / name) as entries:
                if next(entries, None) is not None:
                    return f"entries in {name}"
        except FileNotFoundError:
            continue
        except OSError as exc:  # not readable, or a file where the directory goes
            return f"{name}: {exc.strerror}"
    return None


class LazyFeatures:
    """The feature graph built after READY=1: at the first request that needs it (`lean`: an
    empty root), or at once in the background (a root with records: `at_once`)."""

    def __init__(
        self,
        app: App,
        build: Callable[[], None],
        *,
        at_once: bool = False,
        preload: Callable[[], None] | None = None,
    ) -> None:
        self._app = app
        self._build = build
        self._preload = preload
        self.at_once = at_once
        self.built = False
        self._building: anyio.Event | None = None
        self._owed = at_once
        """The start-up build has not ended its first attempt: a request waits for it."""
        self._parked: dict[str, Any] = {}

    def register(self) -> None:
        """Register as pending every method of the protocol's table not registered yet (the
        daemon's own are: the feature graph registers the others; tests/daemon/
        test_lean_start.py checks it). Lean: the features' idle status details and snapshot.
        At once: `daemon.status` and `events.subscribe` wait for the build as well (what they
        show is the records as the passes left them), and the build starts right after
        READY=1."""
        router = self._app.router
        names = sorted(METHOD_NAMES.difference(router.routes))
        if self._app.config.enable_test_methods:
            names += FEATURE_TEST_METHODS
        for name in names:
            router.add_pending(name, self.ensure)
        if self.at_once:
            for name in PARKED:
                self._parked[name] = router.routes.pop(name)
                router.add_pending(name, self.ensure)
            self._app.reconcile_after_ready()
            self._app.after_ready("features.build", self.build_at_start)
            self._app.on_shutdown("features.build", self._wait_built, stage=0)
            return
        self._app.status_providers.update(idle_details(self._app))
        add_idle_snapshot(self._app)

    async def ensure(self, why: str) -> None:
        """Build the feature graph if it is not yet; `why` names the method that needs it.
        A build under way (or the start-up build not begun yet) is waited for, at most
        `lock_wait_s`."""
        if self.built:
            return
        if self._building is not None or self._owed:
            building = self._event()
            with anyio.move_on_after(self._app.config.lock_wait_s) as waited:
                await building.wait()
            if waited.cancelled_caught:
                raise XumError(
                    ErrorKind.TIMEOUT,
                    f"{why} waited {self._app.config.lock_wait_s:g}s for the daemon's start-up "
                    "(its features load and its records are reconciled first); try again",
                    feature="features",
                )
            if self.built:
                return
            raise _unavailable(why, "its build failed")
        await self._build_once(why)

    async def build_at_start(self) -> None:
        """The background service of a start with records: the graph at once, after READY=1."""
        self._event()
        try:
            await self._build_once("start-up")
        except XumError:
            pass  # logged by the build; the next request builds again
        finally:
            self._owed = False

    async def _wait_built(self) -> None:
        """A stop during the start-up build lets it finish its passes (the drain's deadline
        bounds it) before the other drains run."""
        if self._building is not None:
            await self._building.wait()

    def _event(self) -> anyio.Event:
        if self._building is None:
            self._building = anyio.Event()
        return self._building

    async def _build_once(self, why: str) -> None:
        global _fault_spent
        building = self._event()
        app = self._app
        router = app.router
        routes = dict(router.routes)
        details = dict(app.status_providers)
        mark = app.mark()
        try:
            if BUILD_FAILS.active and not _fault_spent:
                _fault_spent = True
                raise ImportError("simulated: the features failed to load")
            if self._preload is not None:
                # The imports in a worker thread: the loop answers `hello` meanwhile.
                await anyio.to_thread.run_sync(self._preload)
            self._build()
            # Until the graph's startup passes ran, a request of its methods keeps waiting:
            # nothing is answered from records the passes have not reconciled yet.
            built = dict(router.routes)
            router.routes.clear()
            router.routes.update(routes)
            if self.at_once:
                await HOLD_BUILD.hold()
            await app.run_startup_steps(mark.startup)
            router.routes.update(built)
            router.routes.update(self._parked)
            if not app.stopping:
                app.start_background(mark)
            self.built = True
            log.info("lazy_start.features_built", caller=why, at_once=self.at_once)
            if self.at_once:
                app.announce_reconciled()
                app.release_startup_memory()
        except Exception as exc:
            log.exception("lazy_start.build_failed", caller=why)
            # Take back what the failed build registered: the next request starts afresh.
            router.routes.clear()
            router.routes.update(routes)
            app.status_providers.clear()
            app.status_providers.update(details)
            add_idle_snapshot(app)
            app.rollback(mark)
            raise _unavailable(why, type(exc).__name__) from exc
        finally:
            self._building = None
            building.set()


def _unavailable(why: str, cause: str) -> XumError:
    return XumError(
        ErrorKind.INTERNAL,
        f"{why} is unavailable: the daemon's features failed to load ({cause}); see the daemon log",
        feature="features",
    )
