"""Evicting a rebuildable directory: a move into the trash, reclaimed like any trash entry.

No delete path of its own: the directory is renamed into the cleanup's trash area (on the
checkout's mount: ROOT/trash, or the `.xum-trash` next to the checkout) and its deletion is a
`reclaim` obligation (cleanup/steps.py: a mount that appears inside is never descended, a
swapped entry is left alone, a crash mid-delete resumes). The obligation is the intent: it is
committed, deferred, before the move, naming the trash path and the directory's identity
(st_dev, st_ino); after the move it is made due. So a crash

- after the intent, before the move: the reclaim finds no entry and completes (nothing moved;
  the directory is still in the workspace, and the next budget check may choose it again);
- after the move, before it is made due: the next start makes every deferred eviction due
  (`settle`), and the entry is reclaimed.

Right before the move everything the plan checked is checked again: the workspace is active
and nothing holds it, the directory is a real directory (not a link, nothing on its path is a
link), no mount sits at or under it, git still ignores it and tracks nothing under it."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from xum_protocol.errors import ErrorKind

from xumd.app import App
from xumd.base import faults, logs
from xumd.base.errors import XumError
from xumd.checkouts.marker import WorkspaceRef
from xumd.cleanup import trash_area
from xumd.cleanup.obligations import ObligationRow, Obligations, new_id
from xumd.gc import rebuildable
from xumd.gc.plan import Holders
from xumd.lifecycle import rows
from xumd.lifecycle.hooks import busy_message
from xumd.system import fsdelete
from xumd.system.git import Git

log = logs.get("xumd.gc")

AFTER_INTENT = faults.declare(
    "gc.evict.after_intent",
    "an eviction's reclaim is recorded (deferred); the directory is still in the workspace",
)
AFTER_MOVE = faults.declare(
    "gc.evict.after_move",
    "an evicted directory is in the trash; its reclaim is still deferred",
)
HOLD_S = 3600.0
"""How long an eviction's reclaim waits for its move: a move is one rename, so only a crash
leaves it waiting, and the next start makes it due (`settle`)."""
EVICTED = "evicted"
"""The detail key naming what an eviction's reclaim came from."""


class Evictor:
    def __init__(self, app: App, git: Git, hooks: Holders, poke: Callable[[], None]) -> None:
        self.app = app
        self.git = git
        self.hooks = hooks
        self.poke = poke
        self.obligations = Obligations(app.store)

    async def evict(self, workspace_id: str, rel: str, planned_bytes: int) -> str:
        row = rows.get_workspace(self.app.store, workspace_id)
        if row is None or row.state != "active" or row.interrupted:
            raise XumError(
                ErrorKind.INVALID_STATE,
                f"workspace {workspace_id} is no longer active: nothing evicted",
            )
        holders = await self.hooks.holders(
            WorkspaceRef(row.id, row.project_id, row.name, row.path, row.incarnation)
        )
        if holders:
            raise XumError(ErrorKind.BUSY, busy_message(holders))
        source = row.path / rel
        checkout = os.path.realpath(row.path)
        if os.path.realpath(source) != os.path.join(checkout, rel):
            raise XumError(ErrorKind.CONFLICT, f"{source}: a symlink on its path; left alone")
        try:
            st = os.lstat(source)
        except FileNotFoundError:
            raise XumError(ErrorKind.NOT_FOUND, f"{source} is gone") from None
        if not stat.S_ISDIR(st.st_mode):
            raise XumError(ErrorKind.CONFLICT, f"{source} is not a directory; left alone")
        mounts = fsdelete.mounts_at_or_under(source)
        if mounts:
            raise XumError(
                ErrorKind.BUSY, f"mount at {fsdelete.describe_mounts(mounts)}: never evicted"
            )
        if not await rebuildable.ignored(self.git, row.path, rel):
            raise XumError(ErrorKind.CONFLICT, f"{source} is no longer ignored by git")
        if await rebuildable.tracked(self.git, row.path, rel):
            raise XumError(ErrorKind.CONFLICT, f"git tracks paths under {source}")
        trash = self._area(row.path)
        ob_id = new_id()
        entry = trash / ob_id
        now = time.time()
        ob = ObligationRow.due_now(
            id=ob_id,
            workspace_id="",
            project_id=row.project_id,
            kind="reclaim",
            seq=0,
            path=str(entry),
            dev=st.st_dev,
            ino=st.st_ino,
            incarnation="",
            detail={
                "trash_path": str(entry),
                "trash_mount": trash_area.area_mount(trash),
                EVICTED: {"workspace_id": row.id, "path": str(source), "bytes": planned_bytes},
            },
            now=now,
        )
        ob = replace(ob, next_attempt_at=now + HOLD_S)
        with self.app.store.transaction():
            self.obligations.insert(ob)
        try:
            AFTER_INTENT()
            self._move(ob, source, entry, (st.st_dev, st.st_ino))
            AFTER_MOVE()
        finally:
            # Moved or not (a failure, a cancellation): the reclaim is due now, and finds the
            # entry or nothing. Only a crash leaves it deferred, for `settle`.
            self.obligations.make_due(ob, time.time())
            self.poke()
        log.info("gc.evicted", workspace=row.id, path=str(source), trash=str(entry))
        self.app.events.publish(
            "gc.evicted",
            workspace_id=row.id,
            path=str(source),
            bytes=planned_bytes,
            obligation_id=ob.id,
        )
        return f"moved {rel} to the trash (reclaim {ob.id})"

    def _move(
        self, ob: ObligationRow, source: Path, entry: Path, identity: tuple[int, int]
    ) -> None:
        try:
            os.rename(source, entry)
        except OSError as exc:
            self.obligations.abandon(ob, time.time(), f"the move failed: {exc}")
            raise XumError(
                ErrorKind.OPERATION_FAILED, f"moving {source} to the trash failed: {exc}"
            ) from None
        moved = os.lstat(entry)
        if (moved.st_dev, moved.st_ino) != identity:
            os.rename(entry, source)  # swapped between the check and the move: put back
            self.obligations.abandon(ob, time.time(), "swapped during the move; put back")
            raise XumError(ErrorKind.CONFLICT, f"{source} was replaced during the move")

    def _area(self, checkout: Path) -> Path:
        """The trash area on the checkout's mount (a rename cannot cross mounts)."""
        trash = self.app.paths.trash
        trash.mkdir(mode=0o700, parents=True, exist_ok=True)
        if fsdelete.same_mount(trash, checkout):
            return trash
        alt = checkout.parent / ".xum-trash"
        alt.mkdir(mode=0o700, exist_ok=True)
        return alt


def settle(app: App, now: float) -> int:
    """At start (no eviction is in flight): every eviction's reclaim still deferred is due now,
    its entry moved or not (a reclaim that finds none completes). Returns how many."""
    obligations = Obligations(app.store)
    count = 0
    for ob in obligations.list(workspace_id="", state="pending", limit=100_000):
        if EVICTED in ob.detail and ob.next_attempt_at > now:
            obligations.make_due(ob, now)
            count += 1
    if count:
        log.info("gc.evictions_settled", count=count)
    return count
