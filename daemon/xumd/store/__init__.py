"""SQLite state store."""

from xumd.store.db import Store, StoreError

__all__ = ["Store", "StoreError"]
