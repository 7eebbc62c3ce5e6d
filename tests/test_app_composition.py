"""The composition root: drains run in stage order, whatever order features installed them."""

from __future__ import annotations

from pathlib import Path

from xumd.app import App
from xumd.bootstrap import install_features
from xumd.config import DaemonConfig
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
