"""The directory exclusion a cleanup step holds while it touches a workspace's path.

Normally the lifecycle coordinator's: a path is never torn down or trashed while a lifecycle
operation works on the same path. Without the lifecycle feature (unit tests), the same rule is
kept in-process.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Protocol, cast

import anyio

from xumd.app import App
from xumd.cleanup.lifecycle_link import lifecycle_service


class _DirectoryExclusion(Protocol):
    def directory(
        self, path: Path | str, *, timeout: float | None = None, label: str = ""
    ) -> AbstractAsyncContextManager[Any]: ...


class DirectoryLocks:
    def __init__(self, app: App) -> None:
        self.app = app
        self._local: dict[str, anyio.Lock] = {}

    def directory(self, path: str, *, label: str) -> AbstractAsyncContextManager[Any]:
        coord = cast(
            "_DirectoryExclusion | None",
            lifecycle_service(self.app, "xumd.lifecycle.coordinator", "Coordinator"),
        )
        if coord is not None:
            return coord.directory(path, label=label)
        return self._local_directory(path)

    @asynccontextmanager
    async def _local_directory(self, path: str) -> AsyncIterator[None]:
        # Only without the lifecycle feature (unit tests): the same rule, in-process.
        key = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        lock = self._local.setdefault(key, anyio.Lock())
        with anyio.fail_after(self.app.config.cleanup.step_timeout_s):
            await lock.acquire()
        try:
            yield
        finally:
            lock.release()
