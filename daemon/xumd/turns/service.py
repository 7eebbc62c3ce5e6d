"""TurnService: delegated workspace turns.

`mode: "new"`: the daemon generates the handle id and passes an `IntentBinding` to the workspace
service's create; the target's `creating` row (with handle_id and owner_workspace_id) and the turn
row (state `creating`, naming the target) commit in ONE transaction, before any checkout exists.
A crash anywhere after that leaves a target row that the startup pass settles (`active`, or
flagged `interrupted`) and that stays bound to its owner and handle, so the owner can always reach
it with `mode: "existing"`. The binding never comes from client params.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.turn import TurnCreateParams, TurnCreateResult, TurnInfo
from xum_protocol.models.workspace import (
    Runtime,
    WorkspaceCreateParams,
    WorkspaceCreateResult,
    WorkspaceInfo,
)

from xumd.base import faults, logs
from xumd.base.errors import XumError
from xumd.checkouts.marker import WorkspaceRef
from xumd.lifecycle import ids
from xumd.lifecycle import rows as ws_rows
from xumd.lifecycle.create import IntentBinding
from xumd.lifecycle.rows import WorkspaceRow
from xumd.store import Store
from xumd.turns import rows
from xumd.turns.rows import TurnRow

if TYPE_CHECKING:
    from xumd.app import App

log = logs.get("xumd.turns")

AFTER_TARGET = faults.declare(
    "turn.create.after_target", "target workspace created and active; turn not yet open"
)

MODES = ("new", "existing")


def turn_info(row: TurnRow) -> TurnInfo:
    return TurnInfo.model_validate(
        {
            "id": row.id,
            "owner_workspace_id": row.owner_workspace_id,
            "target_workspace_id": row.target_workspace_id,
            "mode": row.mode,
            "state": row.state,
            "reason": row.reason,
            "target_interrupted": row.target_interrupted,
            "created_at": row.created_at,
            "updated_at": row.updated_at,
            "ended_at": row.ended_at,
        }
    )


def check_handle(value: str) -> str:
    """A handle id of another kind (ws_, prj_, ...) is invalid_scope; a malformed one not_found."""
    if value.startswith(rows.PREFIX) and len(value) == len(rows.PREFIX) + 16:
        try:
            int(value[len(rows.PREFIX) :], 16)
            return value
        except ValueError:
            pass
    if "_" in value and not value.startswith(rows.PREFIX):
        raise XumError(
            ErrorKind.INVALID_SCOPE,
            f"{value!r} is not a turn handle (a handle starts with {rows.PREFIX!r})",
            id=value,
        )
    raise XumError(ErrorKind.NOT_FOUND, f"turn {value!r} not found", id=value)


class Admission(Protocol):
    """A shared reservation of the owner (the lifecycle's `Coordinator.shared`): it cannot be
    archived, renamed or removed while its turn is made."""

    def shared(
        self, workspace_id: str, *, label: str = ...
    ) -> AbstractAsyncContextManager[WorkspaceRef]: ...


class Targets(Protocol):
    """How a turn's target is made and shown (the lifecycle's `WorkspaceService`)."""

    async def create(
        self, params: WorkspaceCreateParams, binding: IntentBinding | None = None
    ) -> WorkspaceCreateResult: ...

    def info(self, row: WorkspaceRow) -> WorkspaceInfo: ...


def settle_creating(store: Store, turn: TurnRow, reason: str) -> str:
    """The one decision for a turn left `creating` (a crash, or its create failed): `open`
    when its target row exists (active, or flagged interrupted: still bound), `failed` with
    `reason` when it is gone. Returns "opened" or "failed"."""
    target = turn.target_workspace_id
    if target and ws_rows.get_workspace(store, target) is not None:
        rows.set_state(store, turn.id, rows.OPEN, expect=rows.CREATING)
        return "opened"
    rows.set_state(store, turn.id, rows.FAILED, expect=rows.CREATING, reason=reason)
    return "failed"


Reconcile = Callable[[], dict[str, int]]
"""Settle every turn left `creating` (recovery's pass calls it in its transaction)."""


def reconcile(store: Store) -> dict[str, int]:
    """Startup (recovery's pass, in its transaction): a turn left `creating` by a crash is
    `open` when its target row exists (the target is then active or flagged interrupted: still
    bound), `failed` when it is gone. It reads and writes rows only, so recovery takes it
    without the turn service, which is built after the lifecycle."""
    counts = {"opened": 0, "failed": 0}
    for turn in rows.in_state(store, rows.CREATING):
        settled = settle_creating(store, turn, "the target's creation was undone before a crash")
        counts[settled] += 1
    return counts


class TurnService:
    def __init__(self, app: App, workspaces: Targets, coord: Admission) -> None:
        self.app = app
        self.store = app.store
        self.workspaces = workspaces
        self.coord = coord

    # -- read ----------------------------------------------------------------------------------

    def get(self, handle_id: str) -> TurnRow:
        found = rows.get(self.store, check_handle(handle_id))
        if found is None:
            raise XumError(ErrorKind.NOT_FOUND, f"turn {handle_id!r} not found", id=handle_id)
        return found

    def list_for(self, owner_workspace_id: str) -> list[TurnRow]:
        ids.check_id(owner_workspace_id, ids.WORKSPACE, "workspace")
        found = rows.for_owner(self.store, owner_workspace_id)
        if not found and ws_rows.get_workspace(self.store, owner_workspace_id) is None:
            # An unknown owner is an error, never an empty success.
            raise XumError(
                ErrorKind.NOT_FOUND,
                f"workspace {owner_workspace_id!r} not found",
                id=owner_workspace_id,
            )
        return found

    # -- create ----------------------------------------------------------------------------------

    async def create(self, params: TurnCreateParams) -> TurnCreateResult:
        if params.mode not in MODES:
            raise XumError(
                ErrorKind.INVALID_SCOPE,
                f"unknown turn mode {params.mode!r} (use 'new' or 'existing')",
                mode=params.mode,
            )
        ids.check_id(params.owner_workspace_id, ids.WORKSPACE, "workspace")
        if params.mode == "new":
            if params.target_workspace_id is not None:
                raise XumError(
                    ErrorKind.INVALID_SCOPE,
                    "mode 'new' creates its target; target_workspace_id belongs to mode 'existing'",
                )
            return await self._create_new(params)
        if params.target_workspace_id is None:
            raise XumError(ErrorKind.INVALID_SCOPE, "mode 'existing' needs target_workspace_id")
        if params.name is not None or params.base is not None or params.runtime is not None:
            raise XumError(
                ErrorKind.INVALID_SCOPE, "mode 'existing' takes no name, base or runtime"
            )
        return await self._reuse(params.owner_workspace_id, params.target_workspace_id)

    async def _create_new(self, params: TurnCreateParams) -> TurnCreateResult:
        # The owner stays reserved (shared: it cannot be archived, renamed or removed) while
        # its target is being made; the reservation validates that it exists and is active.
        async with self.coord.shared(params.owner_workspace_id, label="turn.create") as owner:
            handle_id = rows.new_handle_id()
            # An explicit empty name is a bad name (invalid_name), not a request for a default.
            name = params.name if params.name is not None else f"turn-{secrets.token_hex(4)}"
            # The delegate works like its owner unless told otherwise: a plain-directory
            # project's owner is a directory, and so is its target.
            runtime = params.runtime or self._runtime_of(owner.id)
            create = WorkspaceCreateParams(
                project_id=owner.project_id, name=name, base=params.base, runtime=runtime
            )

            def record(target_id: str) -> None:
                # Runs inside the target's intent transaction: binding and intent are one.
                rows.insert(
                    self.store,
                    handle_id=handle_id,
                    owner_workspace_id=owner.id,
                    target_workspace_id=target_id,
                    mode="new",
                    state=rows.CREATING,
                )

            binding = IntentBinding(handle_id, owner.id, record)
            try:
                created = await self.workspaces.create(create, binding)
                AFTER_TARGET()
            except BaseException as exc:
                cut = isinstance(exc, anyio.get_cancelled_exc_class())
                self._settle_failed(
                    handle_id,
                    "the target's creation was cut short"
                    + (" (the daemon is shutting down)" if self.app.stopping else "")
                    + " and was undone"
                    if cut
                    else "creating the target workspace failed and was undone",
                )
                raise
            with self.store.transaction():
                rows.set_state(self.store, handle_id, rows.OPEN, expect=rows.CREATING)
            turn = self.get(handle_id)
            self._publish("turn.created", turn)
            log.info("turn.created", turn=handle_id, owner=owner.id, target=created.workspace.id)
            return TurnCreateResult(
                turn=turn_info(turn), workspace=created.workspace, setup=created.setup
            )

    def _runtime_of(self, workspace_id: str) -> Runtime:
        row = ws_rows.get_workspace(self.store, workspace_id)
        return "directory" if row is not None and row.runtime == "directory" else "worktree"

    def _settle_failed(self, handle_id: str, reason: str) -> None:
        """The turn's creation failed: settle it as the startup pass would (`reconcile`). The
        create undid itself (the target row is gone): the turn says `failed`. The target row
        survived (active, or flagged interrupted by a failed undo): the turn is `open`, bound
        to it; left `creating` it would be stuck until a restart."""
        turn = rows.get(self.store, handle_id)
        if turn is None or turn.state != rows.CREATING:
            return
        with self.store.transaction():
            settled = settle_creating(self.store, turn, reason)
        if settled == "opened":
            self._publish("turn.created", self.get(handle_id))

    async def _reuse(self, owner_id: str, target_id: str) -> TurnCreateResult:
        ids.check_id(target_id, ids.WORKSPACE, "workspace")
        async with self.coord.shared(owner_id, label="turn.create"):
            target = ws_rows.get_workspace(self.store, target_id)
            if target is None:
                raise XumError(
                    ErrorKind.NOT_FOUND, f"workspace {target_id!r} not found", id=target_id
                )
            if target.owner_workspace_id != owner_id or target.handle_id is None:
                raise XumError(
                    ErrorKind.INVALID_SCOPE,
                    f"workspace {target_id!r} is not bound to owner {owner_id!r}; only a target "
                    "this owner delegated to can be reused",
                    id=target_id,
                )
            if target.state != "active" or target.interrupted:
                raise XumError(
                    ErrorKind.INVALID_STATE,
                    f"workspace {target.name!r} is {target.state}"
                    + (" (interrupted: keep or remove it first)" if target.interrupted else ""),
                    state=target.state,
                )
            handle_id = rows.new_handle_id()
            with self.store.transaction():
                rows.insert(
                    self.store,
                    handle_id=handle_id,
                    owner_workspace_id=owner_id,
                    target_workspace_id=target_id,
                    mode="existing",
                    state=rows.OPEN,
                )
            turn = self.get(handle_id)
            self._publish("turn.created", turn)
            return TurnCreateResult(
                turn=turn_info(turn), workspace=self.workspaces.info(target), setup=None
            )

    # -- end -------------------------------------------------------------------------------------

    def end(self, handle_id: str) -> TurnRow:
        turn = self.get(handle_id)
        if turn.state != rows.OPEN:
            raise XumError(
                ErrorKind.INVALID_STATE,
                f"turn {handle_id!r} is {turn.state}; only an open turn is ended",
                state=turn.state,
            )
        with self.store.transaction():
            if not rows.set_state(self.store, handle_id, rows.ENDED, expect=rows.OPEN):
                raise XumError(
                    ErrorKind.INVALID_STATE, f"turn {handle_id!r} changed meanwhile", id=handle_id
                )
        ended = self.get(handle_id)
        self._publish("turn.ended", ended)
        return ended

    def _publish(self, event: str, turn: TurnRow) -> None:
        self.app.events.publish(event, turn=turn_info(turn).model_dump(mode="json"))
