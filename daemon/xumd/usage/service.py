"""`workspace.usage`: walks run in worker threads (at most two at once), under one deadline
per call (`usage.deadline_s`); answers are cached per workspace incarnation for `usage.cache_s`
and carry their age. The root totals add the trash, the archive store and pending reclaims."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio
from xum_protocol.models.usage import (
    RootUsage,
    UsageFigures,
    WorkspaceUsage,
    WorkspaceUsageParams,
    WorkspaceUsageResult,
)

from xumd.app import App
from xumd.base import logs
from xumd.lifecycle import owned, rows
from xumd.lifecycle.context import require_workspace
from xumd.lifecycle.rows import WorkspaceRow
from xumd.system.git import Git
from xumd.usage import walk

log = logs.get("xumd.usage")


@dataclass(frozen=True, slots=True)
class _Cached:
    incarnation: str
    path: str
    computed_at: float
    """Wall time, for the answer; freshness and age go by `walked` (monotonic): a wall clock
    stepped back must not keep an old walk fresh."""
    walked: float
    figures: UsageFigures | None


class PendingReclaims(Protocol):
    """What usage asks of the cleanup: the reclaims still to run and their trash entries
    (`CleanupService.pending_reclaims`)."""

    def pending_reclaims(self) -> tuple[int, list[Path]]: ...


class PoolEntries(Protocol):
    """The warm pool's checkouts (`PoolService.entry_paths`): counted, never as workspaces."""

    def entry_paths(self) -> list[Path]: ...


class UsageService:
    def __init__(self, app: App, git: Git, reclaims: PendingReclaims, pool: PoolEntries) -> None:
        self.app = app
        self.git = git
        self.reclaims = reclaims
        self.pool = pool
        self.config = app.config.usage
        self._cache: dict[str, _Cached] = {}
        # Walks are disk-bound: two at once keep a `du` of everything from starving the rest.
        self._limiter = anyio.CapacityLimiter(2)

    async def usage(self, params: WorkspaceUsageParams) -> WorkspaceUsageResult:
        deadline = time.monotonic() + self.config.deadline_s
        if params.workspace_id is not None:
            row = require_workspace(self.app.store, params.workspace_id)
            return WorkspaceUsageResult(workspaces=[await self._one(row, deadline, params.refresh)])
        listed = await self._all(rows.list_workspaces(self.app.store), deadline, params.refresh)
        return WorkspaceUsageResult(workspaces=listed, root=await self._root(listed, deadline))

    async def _all(
        self, found: list[WorkspaceRow], deadline: float, refresh: bool
    ) -> list[WorkspaceUsage]:
        """Two workspaces at a time under the call's one deadline: a checkout too big to walk
        in it holds one lane, never the whole deadline from every workspace after it (a partial
        walk is not cached, so one by one the same ones would be starved at every call)."""
        listed: list[WorkspaceUsage | None] = [None] * len(found)
        failed: list[Exception] = []
        lanes = anyio.CapacityLimiter(2)

        async def one(index: int, row: WorkspaceRow) -> None:
            async with lanes:
                try:
                    listed[index] = await self._one(row, deadline, refresh)
                except Exception as exc:  # answered as itself below, not as a task group's
                    failed.append(exc)

        async with anyio.create_task_group() as tg:
            for index, row in enumerate(found):
                tg.start_soon(one, index, row)
        if failed:
            raise failed[0]
        return [entry for entry in listed if entry is not None]

    async def figures(self, row: WorkspaceRow, refresh: bool = False) -> UsageFigures | None:
        """For gc: one workspace's figures under the configured deadline."""
        deadline = time.monotonic() + self.config.deadline_s
        return (await self._one(row, deadline, refresh)).usage

    async def measure(self, path: Path | str) -> UsageFigures:
        """For gc: a directory that is no workspace's (a kept copy), walked like the rest:
        under the configured deadline, at most two walks at once, never cached."""
        return await self._walk(path, time.monotonic() + self.config.deadline_s)

    def cached(self, row: WorkspaceRow) -> UsageFigures | None:
        """For gc's report of what it freed: the checkout's figures as a walk within `cache_s`
        found them (None: no such walk), never a walk of its own."""
        cached = self._cache.get(row.id)
        if cached is None or not self._fresh(cached, row, time.monotonic()):
            return None
        return cached.figures

    def _fresh(self, cached: _Cached | None, row: WorkspaceRow, now: float) -> bool:
        return (
            cached is not None
            and cached.incarnation == row.incarnation
            and cached.path == str(row.path)
            and now - cached.walked <= self.config.cache_s
            and (cached.figures is None or cached.figures.complete)
        )

    async def _one(self, row: WorkspaceRow, deadline: float, refresh: bool) -> WorkspaceUsage:
        now, wall = time.monotonic(), time.time()
        cached = self._cache.get(row.id)
        if refresh or not self._fresh(cached, row, now):
            figures = await self._walk_checkout(row, deadline)
            cached = _Cached(row.incarnation, str(row.path), wall, now, figures)
            self._cache[row.id] = cached
        assert cached is not None
        return WorkspaceUsage(
            workspace_id=row.id,
            project_id=row.project_id,
            name=row.name,
            state=row.state,
            path=str(row.path),
            usage=cached.figures,
            computed_at=cached.computed_at,
            age_s=max(0.0, now - cached.walked),
        )

    async def _walk_checkout(self, row: WorkspaceRow, deadline: float) -> UsageFigures | None:
        try:
            if not os.path.isdir(row.path) or os.path.islink(row.path):
                return None
        except OSError:
            return None
        ignored: frozenset[str] = frozenset()
        note: str | None = None
        if row.runtime == "worktree" and time.monotonic() < deadline:
            ignored, note = await self._ignored(row.path, deadline)
        figures = await self._walk(row.path, deadline, ignored)
        if note and figures.error is None:
            figures = figures.model_copy(update={"error": note})
        return figures

    async def _ignored(self, path: Path, deadline: float) -> tuple[frozenset[str], str | None]:
        result = await self.git.run(
            path,
            "ls-files",
            "-z",
            "--others",
            "--ignored",
            "--exclude-standard",
            "--directory",
            timeout_s=max(0.1, deadline - time.monotonic()),
            check=False,
        )
        if not result.ok:
            return frozenset(), f"the ignored share is unknown ({result.describe()})"
        if result.output.dropped:
            # git's list was longer than the bounded output: what is named still counts.
            names = bytes(result.output.head).split(b"\0")[:-1]
            note = "the ignored share is a lower bound (git listed too many ignored paths)"
        else:
            names = bytes(result.output.head + result.output.tail).split(b"\0")
            note = None
        return frozenset(n.decode("utf-8", "replace").rstrip("/") for n in names if n), note

    async def _walk(
        self, path: Path | str, deadline: float, ignored: frozenset[str] = frozenset()
    ) -> UsageFigures:
        return await anyio.to_thread.run_sync(
            walk.walk, os.fspath(path), deadline, ignored, limiter=self._limiter
        )

    async def _root(self, listed: list[WorkspaceUsage], deadline: float) -> RootUsage:
        paths = self.app.paths
        trash = await self._walk(paths.trash, deadline) if paths.trash.is_dir() else walk.empty()
        archive = (
            await self._walk(paths.archive_store, deadline)
            if paths.archive_store.is_dir()
            else walk.empty()
        )
        count, pending = self._pending_reclaims()
        reclaim_bytes = 0
        outside = 0
        for source in pending:
            if not os.path.isdir(source):
                continue
            figures = await self._walk(source, deadline)
            reclaim_bytes += figures.bytes
            if not owned.within(owned.real(source), owned.real(paths.trash)):
                outside += figures.bytes
        ws_bytes = sum(w.usage.bytes for w in listed if w.usage is not None)
        entries, pool_bytes = await self._pool(deadline)
        return RootUsage(
            workspaces_bytes=ws_bytes,
            trash=trash,
            archive_store=archive,
            pending_reclaims=count,
            pending_reclaim_bytes=reclaim_bytes,
            pool_entries=entries,
            pool_bytes=pool_bytes,
            total_bytes=ws_bytes + pool_bytes + trash.bytes + archive.bytes + outside,
        )

    async def _pool(self, deadline: float) -> tuple[int, int]:
        """The warm pool's entries and their bytes (lifecycle/pool/), under the call's deadline."""
        paths = [p for p in self.pool.entry_paths() if p.is_dir() and not p.is_symlink()]
        total = 0
        for path in paths:
            total += (await self._walk(path, deadline)).bytes
        return len(paths), total

    def _pending_reclaims(self) -> tuple[int, list[Path]]:
        return self.reclaims.pending_reclaims()
