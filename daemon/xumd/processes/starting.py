"""Starting a supervised process (design invariant 3: the lease is written before it runs).

The order: the workspace is admitted (its shared reservation: only an active workspace), the
lease intent is committed, the child starts *gated* (spawn.py's shim waits before exec), its pid
and start time are recorded in the lease, and only then is the gate opened. A failure anywhere
leaves nothing half-started: the gated shim exits without running the program and the lease goes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol

import anyio
from xum_protocol.errors import ErrorKind

from xumd.base import faults, logs
from xumd.base.errors import XumError
from xumd.base.events import EventBus
from xumd.checkouts.marker import WorkspaceRef
from xumd.lifecycle import wsenv
from xumd.processes.durable import DurableIO
from xumd.processes.leases import LeaseStore, new_id
from xumd.processes.managed import Managed, default_label
from xumd.processes.outliving import KeepPolicy
from xumd.processes.ring import OutputRing
from xumd.processes.spawn import Child, ProgramNotFound, resolve_program, start_child
from xumd.processes.state import PROCESS_PREFIX, ProcessTable, SupervisorSettings, TaskHost
from xumd.processes.watching import Watcher
from xumd.system import diskfull
from xumd.system.containment import MARKER_VAR
from xumd.system.procstat import start_time
from xumd.system.procutil import kill_tree

log = logs.get("xumd.processes.starting")

Admit = Callable[[str], AbstractAsyncContextManager[WorkspaceRef]]


class Admission(Protocol):
    """A shared reservation of a workspace (the lifecycle's `Coordinator.shared`): validated
    (exists, active) once held; a structural operation cannot begin while it is."""

    def shared(
        self, workspace_id: str, *, label: str = ...
    ) -> AbstractAsyncContextManager[WorkspaceRef]: ...


_ENV_DROP = (
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "XUM_FAULT",
)
"""The daemon's own service environment: a child must not notify systemd or arm a fault."""

AFTER_INTENT = faults.declare("process.spawn.after_intent", "lease written, child not started")
AFTER_RECORD = faults.declare(
    "process.spawn.after_record", "child started and recorded, program gated (not running)"
)


def child_env(extra: dict[str, str] | None, **xum: str) -> dict[str, str]:
    env = wsenv.child_base(_ENV_DROP)
    for key, value in (extra or {}).items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise XumError(ErrorKind.INVALID_PARAMS, f"invalid environment variable {key!r}")
        env[key] = value
    env.update(xum)
    return env


def _check_request(
    argv: list[str], *, kind: str, pty: bool, cols: int | None, rows: int | None, foreground: bool
) -> None:
    if not argv or any("\0" in arg for arg in argv) or not argv[0]:
        raise XumError(ErrorKind.INVALID_PARAMS, "argv must be a non-empty program and args")
    if foreground and kind not in ("exec", "terminal"):
        raise XumError(ErrorKind.INVALID_PARAMS, f"a {kind} cannot run in the foreground")
    if (cols or rows) and not pty:
        raise XumError(ErrorKind.INVALID_PARAMS, "cols/rows need pty: true")


class Starter:
    def __init__(
        self,
        *,
        table: ProcessTable,
        leases: LeaseStore,
        events: EventBus,
        admit: Admit,
        settings: SupervisorSettings,
        keep: KeepPolicy,
        tasks: TaskHost,
        watcher: Watcher,
    ) -> None:
        self.table = table
        self.leases = leases
        self.events = events
        self.admit = admit
        self.settings = settings
        self.keep = keep
        self.tasks = tasks
        self.watcher = watcher

    async def spawn(
        self,
        *,
        workspace_id: str,
        kind: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        pty: bool = False,
        cols: int | None = None,
        rows: int | None = None,
        label: str | None = None,
        foreground_peer: int | None = None,
    ) -> Managed:
        # Requests may arrive a moment before the background services run: wait, bounded.
        if not await self.tasks.wait_running():
            raise XumError(ErrorKind.SHUTTING_DOWN, "the process supervisor is not running")
        _check_request(
            argv, kind=kind, pty=pty, cols=cols, rows=rows, foreground=foreground_peer is not None
        )
        process_id = new_id(PROCESS_PREFIX)
        async with self.admit(workspace_id) as ref:
            checkout = Path(ref.path)
            if not checkout.is_dir():
                raise XumError(
                    ErrorKind.INVALID_STATE,
                    f"the checkout of workspace {ref.name!r} is missing: {checkout}",
                    id=workspace_id,
                )
            own, xum = self.settings.workspace_env(ref.id)
            # The workspace's variables, then the request's, then XUM_* (never overridden).
            extra = {**xum, "XUM_WORKSPACE_ID": ref.id, "XUM_PROCESS_ID": process_id}
            cont = self.settings.containment
            if cont is not None:
                extra[MARKER_VAR] = str(cont.marker(process_id))
            if pty:
                extra.setdefault("TERM", (env or {}).get("TERM") or "xterm-256color")
            full_env = child_env({**own, **(env or {})}, **extra)
            try:
                resolve_program(argv[0], path_env=full_env.get("PATH"), cwd=checkout)
            except ProgramNotFound as exc:
                raise XumError(ErrorKind.INVALID_PARAMS, str(exc), program=argv[0]) from None
            label = label or default_label(kind, argv)
            keep = self.keep.keepable(kind, pty, foreground_peer is not None)
            detail: dict[str, Any] = {"argv": argv, "pty": pty, "checkout": str(checkout)}
            if keep:
                detail["io"] = "file"
            lease = self.leases.write_intent(
                workspace_id=ref.id,
                kind=kind,
                holder=process_id,
                label=label,
                process_id=process_id,
                detail=detail,
            )
            io: DurableIO | None = None
            try:
                AFTER_INTENT()
                if keep:
                    assert self.keep.io_dir is not None
                    io = DurableIO.create(self.keep.io_dir, process_id)
                runs = cont.runs if cont is not None else None
                # Its own cgroup (where one is delegated): the program joins it before it runs.
                run_argv = runs.join_argv(process_id, argv) if runs is not None else argv
                child = _start_on(
                    io, run_argv, checkout, full_env, pty=pty, cols=cols or 80, rows=rows or 24
                )
            except BaseException as exc:
                # Any failure, not only an OSError: a lease intent left behind would make the
                # workspace `busy` until a restart reclaimed it.
                if io is not None:
                    io.remove()
                self.leases.remove(lease.id, reason="spawn failed")
                if not isinstance(exc, OSError):
                    raise
                if diskfull.is_no_space_oserror(exc):
                    # The durable output files could not be made: name the full filesystem.
                    raise diskfull.from_oserror(exc, f"the output files of {argv[0]}") from None
                raise XumError(
                    ErrorKind.OPERATION_FAILED, f"cannot start {argv[0]}: {exc.strerror or exc}"
                ) from None
            try:
                started = start_time(child.pid)
                self.leases.record_pid(lease.id, child.pid, child.pid, started)
                AFTER_RECORD()
                child.open_gate()
                ring = (
                    io.open_log(
                        head_limit=self.settings.head_bytes, tail_limit=self.settings.tail_bytes
                    )
                    if io is not None
                    else OutputRing(self.settings.head_bytes, self.settings.tail_bytes)
                )
            except BaseException:
                # Nothing half-started: the gated shim exits without running the program.
                child.close_gate()
                with anyio.CancelScope(shield=True):
                    await kill_tree(child.pid, child.pid, 1.0)
                child.popen.wait(timeout=2)
                child.close_all()
                if io is not None:
                    io.remove()
                self.leases.remove(lease.id, reason="spawn failed")
                raise
            managed = Managed(
                id=process_id,
                workspace_id=ref.id,
                kind=kind,
                argv=list(argv),
                label=label,
                pty=pty,
                lease_id=lease.id,
                pid=child.pid,
                pgid=child.pid,
                start_time=started,
                started_at=time.time(),
                checkout=checkout,
                child=child,
                ring=ring,
                io=io,
                on_daemon_stop="keep" if keep else "stop",
                foreground_peer=foreground_peer,
            )
            self.table.add(managed)
            self.tasks.start_soon(self.watcher.watch, managed)
        log.info("process.started", process=process_id, pid=child.pid, kind=kind, workspace=ref.id)
        self.events.publish("process.started", process=managed.info())
        return managed


def _start_on(
    io: DurableIO | None,
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    *,
    pty: bool,
    cols: int,
    rows: int,
) -> Child:
    """Start the gated child on its durable FIFO and output file, or on pipes / a PTY."""
    if io is None:
        return start_child(argv, cwd=cwd, env=env, pty=pty, cols=cols, rows=rows)
    stdin, stdout = io.child_stdio()
    try:
        return start_child(argv, cwd=cwd, env=env, pty=False, stdio=(stdin, stdout))
    finally:
        os.close(stdin)
        os.close(stdout)
