"""Auto-archive: a workspace created with `auto_archive: "on_agent_exit"` is archived when its
agent exits successfully, through the normal archive path (WorkspaceService.archive: same
reservation, quiescence check and snapshot as a user's archive).

Transient refusals (busy, timeout, a cleanup still pending, a failed step) are retried with capped
exponential backoff; the outcome is published as an event and stored on the workspace row
(`workspaces.auto_archive_outcome`, JSON). A retry that finds a newer incarnation (archived and
restored by the user meanwhile) ends `superseded` and leaves it alone.

The supervisor sees the exit and the auto-archiver archives, through the workspace service, whose
quiescence check asks the supervisor: the supervisor is built before that service and the
auto-archiver after it. `OwedArchives` is what lies between: built first, handed to both (the
supervisor's exit listener, the auto-archiver's source).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from xum_protocol.errors import ErrorKind

from xumd.base import faults, logs
from xumd.base.errors import XumError
from xumd.base.events import EventBus
from xumd.lifecycle import rows
from xumd.processes.managed import Managed
from xumd.store import Store

log = logs.get("xumd.processes.auto_archive")

HOLD_RETRY = faults.declare(
    "processes.auto_archive.hold_retry",
    "simulate: hold each auto-archive retry (after its backoff, before it looks at the "
    "workspace) until the test releases it (faults.FaultPoint.hold)",
    simulate=True,
)

ON_AGENT_EXIT = "on_agent_exit"
TRANSIENT = {
    ErrorKind.BUSY,
    ErrorKind.TIMEOUT,
    ErrorKind.CLEANUP_PENDING,
    ErrorKind.OPERATION_FAILED,
    ErrorKind.INTERNAL,
}

Archive = Callable[[str], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Owed:
    workspace_id: str
    process_id: str
    incarnation: str
    """The incarnation the archive is owed to, read when the agent exited."""


class OwedArchives:
    """The successful agent exits that owe their workspace an archive, in the order they
    exited. `on_exit` is the supervisor's exit listener (synchronous: it reads the row at the
    exit, so the incarnation owed is the one the agent ran in); the auto-archiver takes them
    while the supervisor serves."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._send, self.received = anyio.create_memory_object_stream[Owed](math.inf)

    def on_exit(self, managed: Managed) -> None:
        if managed.kind != "agent" or not managed.exit or managed.exit.get("code") != 0:
            return
        incarnation = owed_incarnation(self.store, managed.workspace_id)
        if incarnation is not None:
            self._send.send_nowait(Owed(managed.workspace_id, managed.id, incarnation))


def owed_incarnation(store: Store, workspace_id: str) -> str | None:
    """The incarnation an auto-archive is owed to: an active workspace that asked for it."""
    row = rows.get_workspace(store, workspace_id)
    if row is None or row.auto_archive != ON_AGENT_EXIT or row.state != "active":
        return None
    return row.incarnation


class AutoArchiver:
    def __init__(
        self,
        store: Store,
        events: EventBus,
        owed: OwedArchives,
        archive: Archive,
        *,
        attempts: int = 6,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
    ) -> None:
        self.store = store
        self.events = events
        self.owed = owed
        self.archive = archive
        self.attempts = attempts
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._running: set[str] = set()

    def _incarnation(self, workspace_id: str) -> str | None:
        return owed_incarnation(self.store, workspace_id)

    def _archived(self, workspace_id: str, incarnation: str | None) -> bool:
        row = rows.get_workspace(self.store, workspace_id)
        return (
            row is not None
            and row.state == "archived"
            and (incarnation is None or row.incarnation == incarnation)
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Owed archives are taken, each in a task of its own, while the body runs (the
        supervisor serving); one owed while the workspace's archive is already under way is
        that archive's. An archive under way when the body ends is finished, not cut."""
        async with anyio.create_task_group() as tg:
            taking = anyio.CancelScope()

            async def take() -> None:
                with taking:
                    async for owed in self.owed.received:
                        if owed.workspace_id in self._running:
                            continue
                        self._running.add(owed.workspace_id)
                        tg.start_soon(
                            self.run, owed.workspace_id, owed.process_id, owed.incarnation
                        )

            tg.start_soon(take)
            try:
                yield
            finally:
                taking.cancel()

    async def run(
        self, workspace_id: str, process_id: str, incarnation: str | None = None
    ) -> dict[str, Any]:
        try:
            return await self._attempts(workspace_id, process_id, incarnation)
        finally:
            self._running.discard(workspace_id)

    async def _attempts(
        self, workspace_id: str, process_id: str, incarnation: str | None
    ) -> dict[str, Any]:
        delay = self.backoff_initial_s
        last_error: str | None = None
        for attempt in range(1, self.attempts + 1):
            if attempt > 1:
                await HOLD_RETRY.hold()
            now = self._incarnation(workspace_id)
            if incarnation is not None and now is not None and now != incarnation:
                # Archived and restored (or otherwise re-materialised) since the agent exited:
                # the archive was owed to that incarnation, never to its successor. Checked with
                # no await before archive takes its reservation, so it cannot change in between.
                # Not a failure: the owed archive happened (by the user) and is moot now.
                error = (
                    f"the workspace was materialised again (incarnation {now}) since the agent "
                    f"of incarnation {incarnation} exited; not archived"
                )
                return self._record(workspace_id, process_id, "superseded", attempt, error)
            try:
                await self.archive(workspace_id)
            except anyio.get_cancelled_exc_class():
                # Cut short (the daemon is stopping) after the archive committed, in its
                # cleanup: it did archive, and the outcome says so (the cleanup stays pending
                # for the retry service). Recorded without awaiting: the scope is cancelled.
                if self._archived(workspace_id, incarnation):
                    self._record(workspace_id, process_id, "archived", attempt, None)
                raise
            except XumError as exc:
                last_error = f"{exc.kind.value}: {exc.message}"
                if exc.kind not in TRANSIENT:
                    return self._record(workspace_id, process_id, "failed", attempt, last_error)
                log.info(
                    "auto_archive.retry", workspace=workspace_id, attempt=attempt, error=last_error
                )
            except Exception as exc:
                log.exception("auto_archive.error", workspace=workspace_id)
                last_error = f"internal: {exc}"
            else:
                return self._record(workspace_id, process_id, "archived", attempt, None)
            if attempt < self.attempts:
                self._record(workspace_id, process_id, "retrying", attempt, last_error, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, self.backoff_max_s)
        return self._record(workspace_id, process_id, "gave_up", self.attempts, last_error)

    def _record(  # noqa: PLR0917 - private, called with the outcome's fields in order
        self,
        workspace_id: str,
        process_id: str,
        status: str,
        attempts: int,
        error: str | None,
        retry_in_s: float | None = None,
    ) -> dict[str, Any]:
        outcome: dict[str, Any] = {
            "status": status,
            "attempts": attempts,
            "error": error,
            "process_id": process_id,
            "at": time.time(),
            "next_attempt_at": time.time() + retry_in_s if retry_in_s is not None else None,
        }
        with self.store.transaction():
            rows.set_auto_archive_outcome(self.store, workspace_id, json.dumps(outcome))
        log.info("auto_archive.outcome", workspace=workspace_id, status=status, attempts=attempts)
        self.events.publish("workspace.auto_archive", workspace_id=workspace_id, outcome=outcome)
        return outcome
