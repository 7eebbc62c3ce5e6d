"""The lifecycle's `MakeRoom` port (lifecycle/capacity.py), served by gc.

gc is the higher layer and is built after the workspace service (lazily, at its first use), so
the create cannot hold the gc service. It holds this small object instead, built before both by
the composition root: a create hands it its request and waits (bounded); gc's server task
(`serve`, started by gc/feature.py) takes each request in turn, builds the gc service if it is
not yet, and answers. A request gc does not answer in time is answered with why, and the create
decides on the free space as it is then. After a create, `created` asks for a budget check in
the background: coalesced (one pending at most), never awaited by the create.

It also holds the root's bytes as gc last measured them (`ledger`, lifecycle/rootbytes.py):
gc records each measurement there, a create reads and reserves there, and `measure_root` asks
gc for a measurement when there is none recent."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import anyio

from xumd.base import logs
from xumd.lifecycle.capacity import Made
from xumd.lifecycle.rootbytes import RootBytes

log = logs.get("xumd.gc")

ASKS = 64
"""Requests queued at most; a create beyond it waits for a place (within its bound)."""


@dataclass(slots=True)
class Ask:
    """A create's request (`path`, `need`, with `project_id` one more workspace of it), a
    measurement of the root (`measure`), or (`path` None) a budget check."""

    path: Path | None
    need: int = 0
    project_id: str | None = None
    measure: bool = False
    made: Made | None = None
    abandoned: bool = False
    """The create stopped waiting (its bound, or it was cancelled): nothing to do for it."""
    done: anyio.Event = field(default_factory=anyio.Event)

    def answer(self, made: Made) -> None:
        self.made = made
        self.done.set()


class Servant(Protocol):
    """The gc service as this port's server uses it."""

    async def make_room(self, path: Path, need: int, *, project_id: str | None) -> Made: ...

    async def measure_root(self) -> None: ...

    def wake(self) -> None: ...


class Room:
    def __init__(self, wait_s: float, ledger: RootBytes) -> None:
        self.wait_s = wait_s
        self._ledger = ledger
        self._send, self._receive = anyio.create_memory_object_stream[Ask](ASKS)
        self._check_pending = False

    @property
    def ledger(self) -> RootBytes:
        return self._ledger

    async def make_room(self, path: Path, need: int, *, project_id: str | None = None) -> Made:
        return await self._ask(Ask(path, need, project_id))

    async def measure_root(self) -> None:
        made = await self._ask(Ask(Path("/"), measure=True))
        if made.note:
            log.info("gc.measure_root_unanswered", note=made.note)

    async def _ask(self, ask: Ask) -> Made:
        path, need = ask.path, ask.need
        try:
            with anyio.move_on_after(self.wait_s):
                await self._send.send(ask)
                await ask.done.wait()
        finally:
            ask.abandoned = ask.made is None
        if ask.made is None:
            log.warning("gc.make_room_unanswered", path=str(path), need=need, wait_s=self.wait_s)
            return Made(note=f"gc did not answer within {self.wait_s:.0f} s")
        return ask.made

    def created(self) -> None:
        if self._check_pending:
            return
        try:
            self._send.send_nowait(Ask(None))
        except anyio.WouldBlock:
            return  # the queue is full: a check runs after those requests anyway
        self._check_pending = True

    async def serve(
        self, *, build: Callable[[], Servant], built: Callable[[], Servant | None]
    ) -> None:
        """gc's server task (after readiness): each request in turn; gc is built for a create's
        request (`build`), and a budget check wakes it only if it is built (`built`: its worker
        checks the budget from the start whenever one is set)."""
        async for ask in self._receive:
            if ask.path is None:
                self._check_pending = False
                servant = built()
                if servant is not None:
                    servant.wake()
                continue
            if ask.abandoned:
                continue
            try:
                if ask.measure:
                    await build().measure_root()
                    made = Made()
                else:
                    made = await build().make_room(ask.path, ask.need, project_id=ask.project_id)
            except Exception as exc:  # a failed attempt is the create's answer, not the end
                log.warning("gc.make_room_failed", error=repr(exc))
                made = Made(note=f"gc could not make room: {type(exc).__name__}: {exc}")
            ask.answer(made)
