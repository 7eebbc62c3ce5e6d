"""The lean start: a root with nothing to recover serves before its features are loaded.

Time to ready is almost all imports (docs/PERFORMANCE.md, "Lean start"), and most of
them are the features' (lifecycle, cleanup, processes, turns, usage, recovery, gc) for the
startup passes the contract keeps before serving: adoption and recovery. A root whose store holds
no record and whose state directories are empty or absent gives those passes nothing to do, so
its daemon registers the features' methods by name only (`Router.add_pending`: `hello` lists
them, each refuses bad params with the same errors once built) and builds the whole feature
graph at the first request that names one of them. The containment sweep is not among what
waits: it is the daemon's own feature, and runs before READY=1 on every start.

The build runs on the event loop: the imports and installs synchronously (nothing interleaves),
then the startup steps the features added (adoption, recovery: on a store that still holds
nothing, since only a feature writes one), then their background services start. Requests that
arrive meanwhile wait for the same build. A build that fails is logged and answered `internal`;
what it registered is taken back, and the next request builds again.

Until the build, `daemon.status` shows each feature's details, and `events.subscribe`'s snapshot
each feature's part, as that feature shows them on an empty root (`idle_details`,
`add_idle_snapshot`; tests/daemon/test_lean_start.py compares them with the built features'), so
that neither waits for the build (docs/PERFORMANCE.md, "Copies kept for speed").
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
    """The feature graph of a lean start, built by `build` at the first request that needs it."""

    def __init__(self, app: App, build: Callable[[], None]) -> None:
        self._app = app
        self._build = build
        self.built = False
        self._building: anyio.Event | None = None

    def register(self) -> None:
        """Register as pending every method of the protocol's table not registered yet (the
        daemon's own are: the feature graph registers the others; tests/daemon/
        test_lean_start.py checks it), and the features' idle status details."""
        names = sorted(METHOD_NAMES.difference(self._app.router.routes))
        if self._app.config.enable_test_methods:
            names += FEATURE_TEST_METHODS
        for name in names:
            self._app.router.add_pending(name, self.ensure)
        self._app.status_providers.update(idle_details(self._app))
        add_idle_snapshot(self._app)

    async def ensure(self, why: str) -> None:
        """Build the feature graph if it is not yet; `why` names the method that needs it."""
        global _fault_spent
        if self.built:
            return
        if self._building is not None:
            await self._building.wait()
            if self.built:
                return
            raise _unavailable(why, "its build failed")
        self._building = building = anyio.Event()
        app = self._app
        routes = dict(app.router.routes)
        details = dict(app.status_providers)
        mark = app.mark()
        try:
            if BUILD_FAILS.active and not _fault_spent:
                _fault_spent = True
                raise ImportError("simulated: the features failed to load")
            self._build()
            await app.run_startup_steps(mark.startup)
            app.start_background(mark)
            self.built = True
        except Exception as exc:
            log.exception("lazy_start.build_failed", caller=why)
            # Take back what the failed build registered: the next request starts afresh.
            app.router.routes.clear()
            app.router.routes.update(routes)
            app.status_providers.clear()
            app.status_providers.update(details)
            add_idle_snapshot(app)
            app.rollback(mark)
            raise _unavailable(why, type(exc).__name__) from exc
        finally:
            self._building = None
            building.set()
        log.info("lazy_start.features_built", caller=why)


def _unavailable(why: str, cause: str) -> XumError:
    return XumError(
        ErrorKind.INTERNAL,
        f"{why} is unavailable: the daemon's features failed to load ({cause}); see the daemon log",
        feature="features",
    )
