"""Foreground processes: bound to the connection that started them, until moved to the background.

When the caller's connection closes, its foreground processes are stopped (`stop_reason:
"session"`), bounded; what still runs afterwards is reported (logged, and `pending_stop`). Moving
a foreground exec to the background takes the workspace's shared reservation again, so it only
happens in an active workspace; a refused or failed move stops the command.
"""

from __future__ import annotations

from typing import Any

from xum_protocol.errors import ErrorKind

from xumd.base import logs
from xumd.base.errors import XumError
from xumd.base.events import EventBus
from xumd.processes.managed import Managed
from xumd.processes.settlement import Settlement
from xumd.processes.starting import Admit
from xumd.processes.state import ProcessTable, SupervisorSettings, TaskHost
from xumd.processes.stopping import CONFIRM_S, Stopper

log = logs.get("xumd.processes.foreground")

SESSION_SLACK_S = 4.0
"""Beyond the grace and the confirmation, for a session's stops (SIGKILL and the probe)."""


class Foreground:
    def __init__(
        self,
        *,
        table: ProcessTable,
        settlement: Settlement,
        stopper: Stopper,
        events: EventBus,
        admit: Admit,
        settings: SupervisorSettings,
        tasks: TaskHost,
    ) -> None:
        self.table = table
        self.settlement = settlement
        self.stopper = stopper
        self.events = events
        self.admit = admit
        self.settings = settings
        self.tasks = tasks
        self._peers_watched: set[int] = set()

    def watch_peer(self, peer: Any) -> None:
        if peer.id in self._peers_watched:
            return
        self._peers_watched.add(peer.id)
        peer.on_close(lambda: self._peer_closed(peer.id))

    def _peer_closed(self, peer_id: int) -> None:
        self._peers_watched.discard(peer_id)
        targets = [m for m in self.table.live() if m.foreground_peer == peer_id]
        if targets and self.tasks.group is not None:
            log.info("process.session_released", peer=peer_id, processes=[m.id for m in targets])
            self.tasks.start_soon(self._release_session, peer_id, targets)

    async def _release_session(self, peer_id: int, targets: list[Managed]) -> None:
        """Bounded: what still runs afterwards is reported (logged, and `pending_stop`)."""
        deadline = self.settings.grace_s + CONFIRM_S + SESSION_SLACK_S
        left = await self.stopper.stop_many(targets, deadline, "session")
        if left:
            log.warning(
                "process.session_release_left", peer=peer_id, processes=[m.id for m in left]
            )

    async def background(self, managed: Managed) -> Managed:
        """Detach a foreground exec from its caller. A refused or failed move stops the command,
        and it stays `pending_stop` until its exit is confirmed (or a probe settles it)."""
        if managed.kind != "exec":
            raise XumError(
                ErrorKind.INVALID_STATE,
                f"only an exec can move to the background, not a {managed.kind}",
            )
        if managed.foreground_peer is None and managed.state == "running":
            return managed
        refusal: XumError | None = None
        if managed.state != "running":
            refusal = XumError(
                ErrorKind.INVALID_STATE,
                f"process {managed.id} is being stopped ({managed.state}); it cannot move to the "
                "background",
            )
        else:
            try:
                async with self.admit(managed.workspace_id):
                    if managed.state == "running":
                        managed.foreground_peer = None
                        self.events.publish("process.backgrounded", process=managed.info())
                        return managed
            except XumError as exc:
                refusal = exc
            except Exception as exc:  # a failed move is handled like a refused one
                log.exception("process.background_failed", process=managed.id)
                refusal = XumError(ErrorKind.OPERATION_FAILED, f"move failed: {exc}")
            if refusal is None:
                refusal = XumError(ErrorKind.INVALID_STATE, f"process {managed.id} ended meanwhile")
        if managed.live_state:
            self.settlement.mark_pending(managed)
            self.events.publish("process.stopping", process=managed.info())
            self.tasks.start_soon(self.stopper.stop, managed, None, "session")
        refusal.data.update(process_id=managed.id, state=managed.state)
        raise refusal
