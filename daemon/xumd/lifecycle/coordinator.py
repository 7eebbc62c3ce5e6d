"""The lifecycle coordinator: per-workspace reservations and per-directory exclusion.

Reservations (design invariant 6):
- `shared(workspace_id)` is for ownership mutations (spawn a process, acquire a lease). It is
  admitted only while no structural mutation has closed admission (else `busy` at once, naming the
  operation), and validates *after* holding the reservation that the workspace exists and is active.
- `exclusive(workspace_id, op)` is for structural mutations. It refuses `busy` at once while
  another structural mutation of the same workspace runs, closes admission, drains the shared
  holders already admitted (bounded: `timeout` naming them), then resolves the row under the
  reservation. A row that vanished meanwhile is `not_found`, never an empty target.

Directory exclusion is `xumd.checkouts.exclusion.DirectoryExclusion` (shared with cleanup): the
coordinator holds the one the composition root built (`directories`).

Everything here is in-process state: one daemon per root (invariant 7) makes it sufficient.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
from xum_protocol.errors import ErrorKind

from xumd.base import logs
from xumd.base.errors import XumError
from xumd.checkouts.exclusion import DirectoryExclusion
from xumd.checkouts.marker import WorkspaceRef
from xumd.lifecycle import ids, rows
from xumd.store import Store

log = logs.get("xumd.lifecycle.coordinator")


@dataclass
class _Reservation:
    exclusive: anyio.Lock = field(default_factory=anyio.Lock)
    closed_by: str | None = None
    shared: dict[int, str] = field(default_factory=dict)
    changed: anyio.Event = field(default_factory=anyio.Event)
    users: int = 0

    def signal(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


SettleOnFailure = Callable[[str, str], Callable[[BaseException], None]]
"""(workspace id, op) -> what to call if the operation raises (`context.FailureGuard`)."""


class Coordinator:
    def __init__(
        self,
        store: Store,
        *,
        wait_s: float = 30.0,  # pragma: no mutate (the daemon always passes lock_wait_s)
        directories: DirectoryExclusion,
        failure_guard: SettleOnFailure | None,
    ) -> None:
        self.store = store
        self.wait_s = wait_s
        self.directories = directories
        self._reservations: dict[str, _Reservation] = {}
        # Not mutated: tokens are dict keys only: any start is distinct.
        self._tokens = itertools.count(1)  # pragma: no mutate
        self.failure_guard = failure_guard
        """Called with (workspace id, op) when an exclusive reservation is taken; what it
        returns is called (synchronously, still under the reservation) if the operation
        raises: it settles the row as recovery would (`context.FailureGuard`). No default:
        the composition root hands in the lifecycle's; None (a coordinator alone: tests) leaves
        a failed operation's row as it is, by the caller's explicit choice."""

    # -- reservations ------------------------------------------------------------------------

    def _get(self, key: str) -> _Reservation:
        res = self._reservations.get(key)
        if res is None:
            res = self._reservations[key] = _Reservation()
        res.users += 1
        return res

    def _put(self, key: str, res: _Reservation) -> None:
        res.users -= 1
        if res.users == 0 and self._reservations.get(key) is res:
            del self._reservations[key]

    def closed_by(self, key: str) -> str | None:
        res = self._reservations.get(key)
        return res.closed_by if res else None

    @asynccontextmanager
    async def _shared(self, key: str, label: str, what: str) -> AsyncIterator[None]:
        res = self._get(key)
        try:
            if res.closed_by is not None:
                raise XumError(
                    ErrorKind.BUSY,
                    f"{what} {key} is being changed ({res.closed_by} in progress)",
                    operation=res.closed_by,
                    holders=[{"kind": "operation", "label": res.closed_by, "pid": os.getpid()}],
                )
            token = next(self._tokens)
            res.shared[token] = label
            try:
                yield
            finally:
                res.shared.pop(token, None)
                res.signal()
        finally:
            self._put(key, res)

    @asynccontextmanager
    async def _exclusive(
        self, key: str, op: str, what: str, timeout: float | None
    ) -> AsyncIterator[None]:
        wait_s = self.wait_s if timeout is None else timeout
        res = self._get(key)
        try:
            # Two structural mutations of one target never queue: the later one is refused at
            # once, naming the one in progress (so racing archive/remove never both succeed).
            try:
                res.exclusive.acquire_nowait()
            except anyio.WouldBlock:
                raise XumError(
                    ErrorKind.BUSY,
                    f"{what} {key} is being changed ({res.closed_by} in progress)",
                    operation=res.closed_by,
                    holders=[{"kind": "operation", "label": res.closed_by, "pid": os.getpid()}],
                ) from None
            try:
                res.closed_by = op
                res.signal()
                await self._drain(res, key, what, wait_s)
                yield
            finally:
                res.closed_by = None
                res.signal()
                res.exclusive.release()
        finally:
            self._put(key, res)

    async def _drain(self, res: _Reservation, key: str, what: str, wait_s: float) -> None:
        with anyio.move_on_after(wait_s):
            while res.shared:
                await res.changed.wait()
        if res.shared:
            labels = sorted(set(res.shared.values()))
            raise XumError(
                ErrorKind.TIMEOUT,
                f"timed out after {wait_s}s waiting for admitted work on {what} {key} to end: "
                + ", ".join(labels),
                waited_for=labels,
            )

    # -- workspaces ----------------------------------------------------------------------------

    def _ref(self, workspace_id: str, *, active: bool) -> WorkspaceRef:
        row = rows.get_workspace(self.store, workspace_id)
        if row is None:
            raise XumError(
                ErrorKind.NOT_FOUND, f"workspace {workspace_id!r} not found", id=workspace_id
            )
        if active and row.state != "active":
            raise XumError(
                ErrorKind.INVALID_STATE,
                f"workspace {row.name!r} ({workspace_id}) is {row.state}, not active",
                id=workspace_id,
                state=row.state,
            )
        return row.ref()

    @asynccontextmanager
    async def shared(
        self, workspace_id: str, *, label: str = "ownership mutation"
    ) -> AsyncIterator[WorkspaceRef]:
        """A shared reservation: validated (exists, active) after it is held."""
        ids.check_id(workspace_id, ids.WORKSPACE, "workspace")
        async with self._shared(workspace_id, label, "workspace"):
            yield self._ref(workspace_id, active=True)

    @asynccontextmanager
    async def exclusive(
        self, workspace_id: str, op: str, *, timeout: float | None = None
    ) -> AsyncIterator[WorkspaceRef]:
        """Structural: admission closed, admitted holders drained, row resolved under it."""
        ids.check_id(workspace_id, ids.WORKSPACE, "workspace")
        async with self._exclusive(workspace_id, op, "workspace", timeout):
            ref = self._ref(workspace_id, active=False)
            guard = self.failure_guard
            settle = guard(ref.id, op) if guard is not None else None
            try:
                yield ref
            except BaseException as exc:
                # Before the reservation opens: no other operation may see the row mid-way.
                if settle is not None:
                    settle(exc)
                raise

    # -- projects (create admits under shared; project.remove is exclusive) ------------------

    @asynccontextmanager
    async def project_shared(self, project_id: str, *, label: str) -> AsyncIterator[None]:
        async with self._shared(project_id, label, "project"):
            yield

    @asynccontextmanager
    async def project_exclusive(
        self, project_id: str, op: str, *, timeout: float | None = None
    ) -> AsyncIterator[None]:
        async with self._exclusive(project_id, op, "project", timeout):
            yield

    def status(self) -> dict[str, object]:
        return {
            "closed": {k: r.closed_by for k, r in self._reservations.items() if r.closed_by},
            "shared": {k: len(r.shared) for k, r in self._reservations.items() if r.shared},
            "directories": self.directories.held(),
        }
