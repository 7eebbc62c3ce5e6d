"""The composition root: drains run in stage order, whatever order features installed them."""

from __future__ import annotations

from pathlib import Path

from xumd.app import App
from xumd.bootstrap import install_features
from xumd.checkouts.exclusion import DirectoryExclusion
from xumd.cleanup.service import CleanupService
from xumd.config import DaemonConfig
from xumd.lifecycle.coordinator import Coordinator
from xumd.paths import RootPaths
from xumd.store import Store


def test_processes_stop_before_other_drains(tmp_short: Path) -> None:
    store = Store(tmp_short / "state.db")
    store.migrate()
    try:
        app = App(RootPaths(tmp_short), DaemonConfig(), store)
        install_features(app)
        order = app.drain_order()
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
