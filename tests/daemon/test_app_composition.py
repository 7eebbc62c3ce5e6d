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
from xumd.checkouts.marker import WorkspaceRef
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
from xumd.processes.settlement import Settlement
from xumd.processes.supervisor import Supervisor
from xumd.recovery import feature as recovery_feature
from xumd.startup.composition import install_features
from xumd.store import Store
from xumd.system.containment import Containment, Marker
from xumd.system.git import Git


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
    (processes_feature.install, ("leases", "containment")),
    (Coordinator, ("failure_guard", "directories")),
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
        assert supervisor.exit_listeners == [app.get(AutoArchiver).on_exit]
    finally:
        store.close()


def test_the_sweep_refuses_to_guess_what_to_adopt_before_the_leases_are_wired(
    tmp_short: Path,
) -> None:
    """The start-up sweep keeps what a live lease names. Before the lease store is wired (or a
    lean start has said the root holds none) it cannot tell, and says so instead of stopping
    what a restart must adopt."""
    store = Store(tmp_short / "state.db")
    store.migrate()
    try:
        app = App(RootPaths(tmp_short), DaemonConfig(), store)
        installed = containment_feature.install(app)
        marker = Marker(tag="t", instance="i", record="proc_0123456789abcdef")
        with pytest.raises(RuntimeError, match="lease store"):
            installed.adoptable(marker)
        installed.adoptable.no_leases()
        assert installed.adoptable(marker) is False
    finally:
        store.close()


def test_a_graph_without_the_hooks_of_processes_and_recovery_does_not_start(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hooks are bound late (processes and recovery are built from the workspace service
    that holds them), so the composition root checks them: without them nothing would say who
    holds a checkout, or settle a failed operation's row, and that is found at start."""
    with pytest.raises(RuntimeError, match="processes, rename_settler, row_settler"):
        LifecycleHooks().require_wired()
    store = Store(tmp_short / "state.db")
    store.migrate()
    try:
        app = App(RootPaths(tmp_short), DaemonConfig(), store)
        install_features(app)
        hooks = app.get(LifecycleHooks)
        hooks.require_wired()
        coordinator = app.get(Coordinator)
        assert isinstance(coordinator.failure_guard, FailureGuard)
        assert coordinator.failure_guard.hooks is hooks
    finally:
        store.close()

    # A graph whose recovery forgot to plug in its settlers is refused while it is built.
    monkeypatch.setattr(recovery_feature, "install", lambda app, **_: None)
    store = Store(tmp_short / "other.db")
    store.migrate()
    try:
        app = App(RootPaths(tmp_short), DaemonConfig(), store)
        with pytest.raises(RuntimeError, match="rename_settler, row_settler"):
            install_features(app)
    finally:
        store.close()


async def test_the_quiescence_check_raises_rather_than_answer_no_holders(tmp_short: Path) -> None:
    ref = WorkspaceRef("ws_0123456789abcdef", "prj_0123456789abcdef", "w", tmp_short, "inc")
    with pytest.raises(RuntimeError, match="processes feature"):
        await LifecycleHooks().holders(ref)
