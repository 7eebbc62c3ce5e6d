"""A daemon's features in this process, on a fresh store: for tests that drive services or
count a store's statements directly, where a real `xumd` would hide what they measure."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from xumd.app import App
from xumd.base.config import DaemonConfig
from xumd.base.paths import RootPaths
from xumd.startup.composition import install_features
from xumd.store import Store


@contextmanager
def installed_app(root: Path) -> Iterator[App]:
    """An `App` rooted at `root` with every feature installed (nothing started); its store is
    `root/state.db`, migrated, and closed on exit."""
    store = Store(root / "state.db")
    store.migrate()
    try:
        app = App(RootPaths(root), DaemonConfig(), store)
        install_features(app)
        yield app
    finally:
        store.close()
