"""The composition root: build every service and wire them, in one place.

Order matters: features that others depend on are installed first, and startup hooks (recovery)
run in installation order before the daemon is ready. A root with nothing to recover starts
lean (`xumd.startup.lazy_start`): the daemon's own features (status, events, the containment sweep)
are installed before readiness, the feature graph (`xumd.startup.feature_graph`) at the first
request that needs it. Each feature gets its collaborators from here, explicitly (git, the directory
exclusion, the script runner, the lifecycle hooks, the services of the features below it), never by
looking a class up by name; which package may import which is the table in
tests/architecture/test_architecture.py.
"""

from __future__ import annotations

from xumd.app import App
from xumd.base import logs
from xumd.daemon import containment_feature
from xumd.daemon import feature as daemon_feature
from xumd.startup import lazy_start
from xumd.system.containment import Containment

log = logs.get("xumd.startup.composition")


def import_deferred() -> None:
    """Import now what the features built at their first request (`lazy_start`: the feature
    graph; `rpc.deferred`: gc, usage) import then: `--list-fault-points` and `XUM_FAULT` must
    see every point a module declares."""
    from xumd.gc import service as gc_service  # noqa: F401
    from xumd.startup import feature_graph  # noqa: F401
    from xumd.usage import service as usage_service  # noqa: F401


def install_features(app: App, *, lean: bool = False) -> None:
    """Install every feature. With `lean` (the daemon's start) the feature graph is built after
    READY=1 (`xumd.startup.lazy_start`): on a root with nothing to recover, at the first request
    that needs it; on a root with records, at once in the background, every method that needs it
    waiting until its startup passes ran. Without `lean`, before serving."""
    daemon_feature.install(app)
    why = lazy_start.why_not_lean(app) if lean else "built whole"
    if why is None:
        # Lean: no table holds a row, so no lease names a process the sweep should adopt.
        # The containment is installed first: its sweep runs before adoption.
        lean_cont = containment_feature.install(app, adoptable=containment_feature.nothing_to_adopt)
        lazy_start.LazyFeatures(app, lambda: _install_graph(app, lean_cont)).register()
    elif lean:
        # Records: the containment (its sweep adopts what a live lease names) and the graph,
        # in the same order as below, right after READY=1.
        lazy_start.LazyFeatures(
            app, lambda: _install_whole(app), at_once=True, preload=_import_graph
        ).register()
    else:
        _install_whole(app)
    log.info("daemon.start_shape", lean=why is None, at_once=lean and why is not None, why=why)
    if app.config.enable_test_methods:
        # Imported here: its models are built at import, and only test daemons serve them.
        from xumd.rpc import spec_examples

        spec_examples.install(app.router)


def _import_graph() -> None:
    from xumd.startup import feature_graph  # noqa: F401


def _install_whole(app: App) -> None:
    from xumd.startup import feature_graph

    leases = feature_graph.lease_store(app)
    cont = containment_feature.install(app, adoptable=containment_feature.leased(leases))
    feature_graph.install(app, cont, leases=leases)


def _install_graph(app: App, containment: Containment) -> None:
    # Imported here: a lean start imports them at the first request that needs them.
    from xumd.startup import feature_graph

    feature_graph.install(app, containment, leases=feature_graph.lease_store(app))
