"""Reaching lifecycle services from cleanup without importing lifecycle internals at import time.

The lifecycle feature may be absent in a partial build (unit tests of cleanup alone); then the
caller falls back to its own behaviour.
"""

from __future__ import annotations

import importlib
from typing import Any

from xumd.app import App


def lifecycle_service(app: App, module: str, name: str) -> Any:
    """The installed service of class `module.name`, or None."""
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    return app.find(cls)
