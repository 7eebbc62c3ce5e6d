"""The composition root: drains run in stage order, whatever order features installed them;
collaborators are constructor arguments, so a graph missing one fails at start."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest
from xumd.app import App
from xumd.base.config import DaemonConfig
from xumd.base.paths import RootPaths
from xumd.checkouts.exclusion import DirectoryExclusion
from xumd.cleanup import feature as cleanup_feature
from xumd.cleanup.outcomes import OutcomeRecorder
from xumd.cleanup.planning import Planner
from xumd.cleanup.service import CleanupService
from xumd.cleanup.steps import Steps
from xumd.daemon import containment_feature
from xumd.lifecycle import feature as lifecycle_feature
from xumd.lifecycle.context import FailureGuard
from xumd.lifecycle.coordinator import Coordinator
from xumd.lifecycle.hooks import LifecycleHooks
from xumd.lifecycle.scripts import ScriptRunner
from xumd.lifecycle.service import WorkspaceService
from xumd.lifecycle.unarchive import ArchiveComparison
from xumd.processes import feature as processes_feature
from xumd.processes.auto_archive import AutoArchiver
from xumd.processes.leases import LeaseStore
from xumd.processes.quiescence import Quiescence
from xumd.processes.settlement import Settlement
from xumd.processes.supervisor import Supervisor
from xumd.recovery.reconcile import Reconciler
from xumd.startup import feature_graph
from xumd.startup.composition import install_features
from xumd.store import Store
from xumd.system.containment import Containment, Marker
from xumd.system.git import Git
from xumd.turns.service import TurnService


def test_processes_stop_before_other_drains(tmp_short: Path) -> None:
    store = Store(tmp_short / "state.db")
    store.migrate()
    try:
        app = App(RootPaths(tmp_short), DaemonConfig(), store)
        install_features(app)
        order = [drain.name for drain in app.mark().drains]
        assert order[0] == "processes"
        assert "cleanup-retry" in order
    finally:
        store.close()


def test_cleanup_and_lifecycle_share_one_directory_exclusion(tmp_short: Path) -> None:
    """A path is never torn down or trashed while a lifecycle operation works on it: the
    cleanup runner and the coordinator hold the one exclusion the composition root built."""
    store = Store(tmp_short / "state.db")
    store.migrate()
    try:
        app = App(RootPaths(tmp_short), DaemonConfig(), store)
        install_features(app)
        coordinator = app.find(Coordinator)
        cleanup = app.find(CleanupService)
        assert coordinator is not None and cleanup is not None
        assert cleanup.runner.directories is coordinator.directories
        assert coordinator.directories is app.find(DirectoryExclusion)
    finally:
        store.close()


def test_the_cleanup_cannot_be_built_without_the_check_that_guards_a_lingering_checkout(
    tmp_short: Path,
) -> None:
    """Before it trashes an archived checkout the cleanup asks the lifecycle whether it holds
    work its archive does not. That answer guards user data, so the check is a required
    constructor argument: a graph that forgets it fails at start, never by answering "nothing
    would be lost" at the moment a checkout is moved."""
    store = Store(tmp_short / "state.db")
    store.migrate()
    try:
        app = App(RootPaths(tmp_short), DaemonConfig(), store)
        with pytest.raises(TypeError, match="unsaved"):
            CleanupService(app)
        with pytest.raises(TypeError, match="unsaved"):
            cleanup_feature.install(
                app, git=Git(), directories=DirectoryExclusion(wait_s=1.0), scripts=None
            )
    finally:
        store.close()


def test_the_cleanup_asks_the_lifecycles_own_comparison(tmp_short: Path) -> None:
    store = Store(tmp_short / "state.db")
    store.migrate()
    try:
        app = App(RootPaths(tmp_short), DaemonConfig(), store)
        install_features(app)
        cleanup = app.find(CleanupService)
        workspaces = app.find(WorkspaceService)
        assert cleanup is not None and workspaces is not None
        check = cleanup.steps.unsaved
        assert isinstance(check, ArchiveComparison)
        assert check.snapshots is workspaces.snapshots and check.store is app.store
    finally:
        store.close()


# Collaborators each constructor must be handed (by the composition root): none has a default
# that would stand in for it, and none is assigned onto the object after it is built.
REQUIRED_COLLABORATORS: list[tuple[Callable[..., object], tuple[str, ...]]] = [
    (CleanupService, ("unsaved", "teardown_env", "git", "directories", "teardown")),
    (Steps, ("unsaved",)),
    (Planner, ("teardown_env",)),
    (OutcomeRecorder, ("poke",)),
    (ScriptRunner, ("leases", "containment")),
    (Supervisor, ("workspace_env", "containment", "exit_listeners")),
    (Settlement, ("exit_listeners",)),
    (lifecycle_feature.scripts, ("leases", "containment")),
    (processes_feature.supervision, ("admission", "leases", "containment")),
    (processes_feature.install, ("supervision", "leases", "hooks", "archive")),
    (Coordinator, ("failure_guard", "directories")),
    (FailureGuard, ("settle_row",)),
    (LifecycleHooks, ("processes", "rename_settler")),
    (WorkspaceService, ("cleanup", "hooks", "failures")),
    (lifecycle_feature.install, ("coord", "failures", "hooks", "cleanup")),
    (Reconciler, ("announce", "removals", "turns")),
    (AutoArchiver, ("owed", "archive")),
    (TurnService, ("workspaces", "coord")),
    (containment_feature.install, ("adoptable",)),
    (feature_graph.install, ("containment", "leases")),
]


@pytest.mark.parametrize(
    ("built", "names"),
    REQUIRED_COLLABORATORS,
    ids=[built.__name__ for built, _ in REQUIRED_COLLABORATORS],
)
def test_collaborators_are_required_constructor_arguments(
    built: Callable[..., object], names: tuple[str, ...]
) -> None:
    parameters = inspect.signature(built).parameters
    for name in names:
        assert name in parameters, f"{built.__name__} takes no {name!r}"
        assert parameters[name].default is inspect.Parameter.empty, (
            f"{built.__name__}({name}=...) has a default: a graph that forgets it would start"
        )


def test_the_graph_hands_the_containment_to_everything_that_runs_a_child(tmp_short: Path) -> None:
    """Git, the script runner and the supervisor get the daemon's containment when they are
    built, and the script runner the processes feature's lease store: none runs a child
    unmarked, or a setup without its lease, for want of a later assignment."""
    store = Store(tmp_short / "state.db")
    store.migrate()
    try:
        app = App(RootPaths(tmp_short), DaemonConfig(), store)
        install_features(app)
        cont = app.find(Containment)
        scripts = app.find(ScriptRunner)
        supervisor = app.find(Supervisor)
        git = app.find(Git)
        assert cont is not None and scripts is not None and supervisor is not None
        assert git is not None
        assert git.containment is cont and scripts.containment is cont
        assert supervisor.settings.containment is cont
        assert scripts.leases is supervisor.leases is app.find(LeaseStore)
        auto = app.get(AutoArchiver)
        assert supervisor.exit_listeners == [auto.owed.on_exit]
    finally:
        store.close()


def test_the_sweep_adopts_what_a_live_lease_names_and_a_lean_start_adopts_nothing(
    tmp_short: Path,
) -> None:
    """The start-up sweep's answer is given at construction: a full start builds the lease
    store first and hands the sweep its answer; a lean start, whose tables hold nothing, says
    so. Neither leaves an unwired state to guess from."""
    store = Store(tmp_short / "state.db")
    store.migrate()
    try:
        app = App(RootPaths(tmp_short), DaemonConfig(), store)
        leases = feature_graph.lease_store(app)
        adoptable = containment_feature.leased(leases)
        marker = Marker(tag="t", instance="i", record="proc_0123456789abcdef")
        assert adoptable(marker) is False  # no lease names it
        assert containment_feature.nothing_to_adopt(marker) is False
        with pytest.raises(TypeError, match="adoptable"):
            containment_feature.install(app)  # type: ignore[call-arg]
    finally:
        store.close()


def test_a_graph_without_the_processes_and_recovery_ports_fails_while_it_is_built(
    tmp_short: Path,
) -> None:
    """The lifecycle's hooks and its failure guard take the processes feature's quiescence
    check and recovery's settlers at construction: a graph that forgets one fails with a
    `TypeError` while it is built, never with "no holders" at the moment of an archive. The
    built graph holds the very objects."""
    with pytest.raises(TypeError, match="processes"):
        LifecycleHooks()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="settle_row"):
        FailureGuard(None)  # type: ignore[call-arg, arg-type]
    store = Store(tmp_short / "state.db")
    store.migrate()
    try:
        app = App(RootPaths(tmp_short), DaemonConfig(), store)
        install_features(app)
        hooks = app.get(LifecycleHooks)
        reconciler = app.get(Reconciler)
        assert hooks.processes is app.get(Quiescence)
        assert hooks.rename_settler == reconciler.settle_journal
        coordinator = app.get(Coordinator)
        assert isinstance(coordinator.failure_guard, FailureGuard)
        assert coordinator.failure_guard.settle_row == reconciler.settle_row
        workspaces = app.get(WorkspaceService)
        assert workspaces.context.hooks is hooks
        assert workspaces.context.failures is coordinator.failure_guard
    finally:
        store.close()


def test_the_hooks_are_frozen(tmp_short: Path) -> None:
    """Nothing plugs into the lifecycle after it is built: the hooks refuse an assignment."""
    store = Store(tmp_short / "state.db")
    store.migrate()
    try:
        app = App(RootPaths(tmp_short), DaemonConfig(), store)
        install_features(app)
        hooks = app.get(LifecycleHooks)
        with pytest.raises(AttributeError):
            hooks.processes = app.get(Quiescence)  # type: ignore[misc]
    finally:
        store.close()
