"""Helpers for the process tests (no tests here): an in-process supervisor on a real store and
real processes, and workspace rows written straight into a daemon's state database."""

from __future__ import annotations

import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from xumd.base.errors import XumError
from xumd.base.events import EventBus
from xumd.checkouts.marker import WorkspaceRef
from xumd.processes.leases import LeaseStore
from xumd.processes.managed import Managed
from xumd.processes.quiescence import Quiescence
from xumd.processes.supervisor import Supervisor
from xumd.store import Store

PY = sys.executable

STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
depth = int(sys.argv[1])
if depth > 0:
    subprocess.Popen([sys.executable, "-c", sys.argv[2], str(depth - 1), sys.argv[2]])
print("pid", os.getpid(), flush=True)
time.sleep(600)
"""


def stubborn_argv(depth: int = 2) -> list[str]:
    """A process ignoring SIGTERM, with `depth` generations of descendants that ignore it too."""
    return [PY, "-c", STUBBORN, str(depth), STUBBORN]


def pids_in(text: str) -> list[int]:
    """The pids printed as `pid N` lines. Only complete lines count: output read while the
    processes still write may end in half a line (`pid` with its number not written yet)."""
    complete = text.split("\n")[:-1]
    found = []
    for line in complete:
        parts = line.split()
        if len(parts) == 2 and parts[0] == "pid" and parts[1].isdigit():
            found.append(int(parts[1]))
    return found


class FakePeer:
    def __init__(self, peer_id: int = 1) -> None:
        self.id = peer_id
        self.pid = None
        self.uid = None
        self.protocol = "1.0"
        self.callbacks: list[Callable[[], None]] = []

    def notify(self, method: str, params: dict[str, Any]) -> bool:
        return True

    def on_close(self, callback: Callable[[], None]) -> None:
        self.callbacks.append(callback)

    def close(self) -> None:
        for callback in self.callbacks:
            callback()


def make_ref(checkout: Path) -> WorkspaceRef:
    checkout.mkdir(parents=True, exist_ok=True)
    return WorkspaceRef(
        id="ws_" + secrets.token_hex(8),
        project_id="prj_" + secrets.token_hex(8),
        name=checkout.name,
        path=checkout,
        incarnation=secrets.token_hex(16),
    )


class Harness:
    def __init__(
        self,
        base: Path,
        *,
        grace_s: float = 1.0,
        probe_interval_s: float = 0.05,
        **supervisor: Any,
    ) -> None:
        self.base = base
        self.store = Store(base / "state.db")
        self.store.migrate()
        self.events = EventBus()
        self.seen: list[Any] = []
        self.events.listen(self.seen.append)
        self.leases = LeaseStore(self.store, self.events)
        self.refs: dict[str, WorkspaceRef] = {}
        self.sup = Supervisor(
            self.leases,
            self.events,
            self.admit,
            grace_s=grace_s,
            probe_interval_s=probe_interval_s,
            workspace_env=lambda _workspace_id: ({}, {}),
            containment=None,
            exit_listeners=[],
            **supervisor,
        )
        self.quiet = Quiescence(self.sup, self.leases)
        self.admission_closed: set[str] = set()

    def workspace(self, name: str = "ws") -> WorkspaceRef:
        ref = make_ref(self.base / name)
        self.refs[ref.id] = ref
        return ref

    @asynccontextmanager
    async def admit(self, workspace_id: str) -> AsyncIterator[WorkspaceRef]:
        from xum_protocol.errors import ErrorKind

        if workspace_id in self.admission_closed:
            raise XumError(ErrorKind.BUSY, f"busy: workspace {workspace_id} is being archived")
        ref = self.refs.get(workspace_id)
        if ref is None:
            raise XumError(ErrorKind.NOT_FOUND, f"workspace {workspace_id!r} not found")
        yield ref

    async def spawn(
        self, ref: WorkspaceRef, argv: list[str], kind: str = "exec", **extra: Any
    ) -> Managed:
        return await self.sup.spawn(workspace_id=ref.id, kind=kind, argv=argv, **extra)

    def lease_rows(self) -> list[sqlite3.Row]:
        return self.store.all("SELECT * FROM leases")


@asynccontextmanager
async def running(harness: Harness) -> AsyncIterator[Harness]:
    async with anyio.create_task_group() as tg:
        await tg.start(harness.sup.serve)
        try:
            yield harness
        finally:
            await harness.sup.shutdown(10.0)
            tg.cancel_scope.cancel()
    harness.store.close()


def external_processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The `external` fixture: processes a test starts itself (editors, terminals), SIGKILLed as
    a group afterwards. Test modules use `external = pytest.fixture(external_processes, ...)`."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def insert_workspace(root: Path, checkout: Path, *, state: str = "active") -> str:
    """Write a project and a workspace row straight into ROOT/state.db (daemon not running)."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    checkout.mkdir(parents=True, exist_ok=True)
    store = Store(root / "state.db")
    store.migrate()
    now = time.time()
    prj = "prj_" + secrets.token_hex(8)
    ws = "ws_" + secrets.token_hex(8)
    st = checkout.stat()
    with store.transaction() as db:
        db.execute(
            "INSERT INTO projects (id, name, path, dev, ino, kind, created_at, updated_at) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (
                prj,
                "p" + prj[-6:],
                str(checkout.parent),
                st.st_dev,
                st.st_ino,
                "directory",
                now,
                now,
            ),
        )
        db.execute(
            "INSERT INTO workspaces (id, project_id, name, runtime, path, state, incarnation, "
            "dev, ino, setup_status, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                ws,
                prj,
                checkout.name,
                "directory",
                str(checkout),
                state,
                secrets.token_hex(16),
                st.st_dev,
                st.st_ino,
                "none",
                now,
                now,
            ),
        )
    store.close()
    return ws
