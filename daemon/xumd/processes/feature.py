"""Install the processes feature: supervisor, leases, quiescence hooks, auto-archive, handlers.

Wiring, in two steps because the lifecycle and this feature need each other:
- `supervision`, before the workspace service: the supervisor (spawns and `lease.acquire` go
  through the coordinator's shared reservation, the `Admission` port) and the quiescence check
  that the lifecycle's hooks take (holders for structural ops, the stopper for archive {stop});
- `install`, after it: the auto-archiver (it archives through the service), the handlers;
- start-up adopts live processes of a previous daemon through their leases (before readiness);
- the supervisor's watchers and settle loop run as a background service; shutdown stops every
  process (bounded), except, with `--keep-processes`, agents and MCP servers started on durable
  I/O under ROOT/processes (see docs/PROCESSES.md), which are left running and adopted.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from xum_protocol.errors import ErrorKind
from xum_protocol.models.lease import (
    LEASE_ACQUIRE,
    LEASE_LIST,
    LEASE_RELEASE,
    AcquireParams,
    LeaseInfo,
    LeaseListParams,
    LeaseListResult,
    LeaseRef,
    LeaseResult,
    ReleaseResult,
)
from xum_protocol.models.process import (
    PROCESS_BACKGROUND,
    PROCESS_GET,
    PROCESS_HOLDERS,
    PROCESS_LIST,
    PROCESS_OUTPUT,
    PROCESS_RELEASE_ALL,
    PROCESS_RESIZE,
    PROCESS_SIGNAL,
    PROCESS_SPAWN,
    PROCESS_STOP,
    PROCESS_WAIT,
    PROCESS_WRITE,
    HolderInfo,
    HoldersParams,
    HoldersResult,
    ListParams,
    ListResult,
    OutputParams,
    OutputResult,
    ProcessInfo,
    ProcessRef,
    ProcessResult,
    ReleaseAllParams,
    ReleaseAllResult,
    ResizeParams,
    SignalParams,
    SpawnParams,
    StopParams,
    WaitParams,
    WriteParams,
    WriteResult,
)

from xumd.app import App
from xumd.base import logs
from xumd.base.errors import XumError
from xumd.checkouts.marker import WorkspaceRef
from xumd.lifecycle import wsenv
from xumd.lifecycle.hooks import LifecycleHooks, busy_message
from xumd.lifecycle.ids import check_id
from xumd.processes.auto_archive import Archive, AutoArchiver, OwedArchives
from xumd.processes.leases import LEASE_PREFIX, LeaseStore
from xumd.processes.managed import Managed
from xumd.processes.quiescence import Quiescence
from xumd.processes.starting import Admission
from xumd.processes.supervisor import Supervisor, parse_signal
from xumd.rpc.dispatch import RequestContext
from xumd.store.memo import StoreMemo
from xumd.system.containment import Containment

log = logs.get("xumd.processes.feature")


def _info(managed: Managed) -> ProcessInfo:
    return ProcessInfo.model_validate(managed.info())


def leases(app: App) -> LeaseStore:
    """The lease store: built by the composition root before the script runner, whose setup
    and teardown runs hold a lease each."""
    return app.provide(LeaseStore(app.store, app.events))


@dataclass(frozen=True, slots=True)
class Supervision:
    """What this feature builds before the workspace service: the supervisor, the quiescence
    check the lifecycle's hooks take, and the archives agents' exits owe (`OwedArchives`)."""

    supervisor: Supervisor
    quiescence: Quiescence
    owed: OwedArchives


def supervision(
    app: App, *, admission: Admission, leases: LeaseStore, containment: Containment
) -> Supervision:
    """Built by the composition root before the workspace service, from the coordinator's
    admission (not the service), the lease store (the script runner's runs hold leases in it
    too) and the containment whose marker every process carries."""
    cfg = app.config.processes

    @asynccontextmanager
    async def admit(workspace_id: str) -> AsyncIterator[WorkspaceRef]:
        async with admission.shared(workspace_id, label="process/lease") as ref:
            yield ref

    owed = OwedArchives(app.store)
    sup = app.provide(
        Supervisor(
            leases,
            app.events,
            admit,
            grace_s=app.config.stop_grace_s,
            probe_interval_s=cfg.probe_interval_s,
            head_bytes=cfg.output_head_bytes,
            tail_bytes=cfg.output_tail_bytes,
            io_dir=app.paths.root / "processes",
            keep_processes=cfg.keep_processes,
            output_poll_s=cfg.output_poll_s,
            workspace_env=lambda wid: wsenv.for_workspace(app.store, app.paths.root, wid),
            containment=containment,
            exit_listeners=[owed.on_exit],
        )
    )
    quiet = app.provide(Quiescence(sup, leases, probe_deadline_s=cfg.probe_deadline_s))
    return Supervision(sup, quiet, owed)


def install(
    app: App,
    *,
    supervision: Supervision,
    leases: LeaseStore,
    hooks: LifecycleHooks,
    archive: Archive,
) -> Supervisor:
    """After the workspace service: the auto-archiver archives through it (`archive`), and
    `process.holders` answers with the lifecycle's whole quiescence check (`hooks`)."""
    cfg = app.config.processes
    sup = supervision.supervisor
    admit = sup.admit
    auto = app.provide(
        AutoArchiver(
            app.store,
            app.events,
            supervision.owed,
            archive,
            attempts=cfg.auto_archive_attempts,
            backoff_initial_s=cfg.auto_archive_backoff_initial_s,
            backoff_max_s=cfg.auto_archive_backoff_max_s,
        )
    )
    if sup.keep_processes and os.environ.get("INVOCATION_ID"):
        # A systemd service: with KillMode=mixed or control-group, the unit's stop SIGKILLs what
        # is left in its cgroup, kept processes included (docs/PROCESSES.md, "systemd").
        log.warning("processes.keep_under_systemd", needs="KillMode=process")

    # -- start, serve, stop --------------------------------------------------------------------

    async def adopt() -> None:
        for managed in sup.adopt():
            app.events.publish("process.adopted", process=managed.info())

    async def serve_with_auto() -> None:
        async with auto.running():
            await sup.serve()

    async def drain() -> None:
        left = await sup.shutdown(max(1.0, app.config.drain_deadline_s - 0.5))
        if left:
            log.warning("processes.drain_left", processes=[m.id for m in left])

    app.on_startup("processes.adopt", adopt)
    app.after_ready("processes.supervisor", serve_with_auto)
    app.on_shutdown("processes", drain, stage=10)
    # Polled by monitors (daemon.status): the lease count is recomputed only when a row changed,
    # the counts only when a record was added, pruned, or its state or stop policy set.
    lease_count = StoreMemo(app.store, lambda: len(leases.rows()))
    summary: list[Any] = [None, None]

    def processes_status() -> dict[str, Any]:
        key = (
            Managed.revision,
            sup.table.revision,
            lease_count(),
            sup.keep_processes,
            sup.keep_problem,
        )
        if summary[0] != key:
            summary[:] = [key, processes_summary(key[2])]
        value: dict[str, Any] = summary[1]
        return value

    def processes_summary(leases_held: int) -> dict[str, Any]:
        return {
            "running": sum(1 for m in sup.procs.values() if m.live_state),
            "pending_stop": sum(1 for m in sup.procs.values() if m.state == "pending_stop"),
            "leases": leases_held,
            "keep_processes": sup.keep_processes,
            "kept_at_stop": sum(1 for m in sup.procs.values() if m.on_daemon_stop == "keep"),
            **({"keep_problem": sup.keep_problem} if sup.keep_problem else {}),
        }

    app.status_providers["processes"] = processes_status
    app.events.add_snapshot_provider(
        "processes", lambda: [m.info() for m in sup.select() if m.live_state]
    )

    # -- process.* -----------------------------------------------------------------------------

    async def spawn(p: SpawnParams, ctx: RequestContext) -> ProcessResult:
        if p.foreground:
            sup.watch_peer(ctx.peer)
        managed = await sup.spawn(
            workspace_id=p.workspace_id,
            kind=p.kind,
            argv=list(p.argv),
            env=dict(p.env) if p.env else None,
            pty=p.pty,
            cols=p.cols,
            rows=p.rows,
            label=p.label,
            foreground_peer=ctx.peer.id if p.foreground else None,
        )
        return ProcessResult(process=_info(managed))

    def _known_workspace(workspace_id: str | None) -> None:
        """A filter naming an unknown workspace is an error, not an empty list. A removed
        workspace whose processes or leases are still around is known."""
        if workspace_id is None:
            return
        check_id(workspace_id, "ws_", "workspace")
        if sup.select(workspace_id) or leases.rows(workspace_id):
            return
        _workspace_ref(workspace_id)

    async def list_(p: ListParams, ctx: RequestContext) -> ListResult:
        _known_workspace(p.workspace_id)
        return ListResult(processes=[_info(m) for m in sup.select(p.workspace_id)])

    async def get(p: ProcessRef, ctx: RequestContext) -> ProcessResult:
        return ProcessResult(process=_info(sup.get(p.process_id)))

    async def output(p: OutputParams, ctx: RequestContext) -> OutputResult:
        managed = sup.get(p.process_id)
        found = await sup.output(managed, p.since, p.wait_s, p.max_bytes, p.encoding)
        return OutputResult.model_validate(found)

    async def write(p: WriteParams, ctx: RequestContext) -> WriteResult:
        managed = sup.get(p.process_id)
        if p.encoding == "base64":
            try:
                data = base64.b64decode(p.data, validate=True)
            except (binascii.Error, ValueError):
                raise XumError(ErrorKind.INVALID_PARAMS, "data is not valid base64") from None
        else:
            data = p.data.encode()
        return WriteResult(written=await sup.write(managed, data, p.eof))

    async def resize(p: ResizeParams, ctx: RequestContext) -> ProcessResult:
        managed = sup.get(p.process_id)
        sup.resize(managed, p.cols, p.rows)
        return ProcessResult(process=_info(managed))

    async def signal_(p: SignalParams, ctx: RequestContext) -> ProcessResult:
        sig = parse_signal(p.signal)
        managed = sup.get(p.process_id)
        sup.signal(managed, sig)
        return ProcessResult(process=_info(managed))

    async def wait(p: WaitParams, ctx: RequestContext) -> ProcessResult:
        return ProcessResult(process=_info(await sup.wait(sup.get(p.process_id), p.timeout_s)))

    async def stop(p: StopParams, ctx: RequestContext) -> ProcessResult:
        return ProcessResult(process=_info(await sup.stop(sup.get(p.process_id), p.grace_s)))

    async def background(p: ProcessRef, ctx: RequestContext) -> ProcessResult:
        return ProcessResult(process=_info(await sup.background(sup.get(p.process_id))))

    async def release_all(p: ReleaseAllParams, ctx: RequestContext) -> ReleaseAllResult:
        _workspace_ref(p.workspace_id)
        deadline = p.deadline_s or app.config.stop_grace_s + 5.0
        stopped, left = await sup.release_all(p.workspace_id, deadline)
        return ReleaseAllResult(stopped=stopped, still_running=[_info(m) for m in left])

    def _workspace_ref(workspace_id: str) -> WorkspaceRef:
        from xumd.lifecycle import rows

        check_id(workspace_id, "ws_", "workspace")
        row = rows.get_workspace(app.store, workspace_id)
        if row is None:
            raise XumError(
                ErrorKind.NOT_FOUND, f"workspace {workspace_id!r} not found", id=workspace_id
            )
        return row.ref()

    async def holders(p: HoldersParams, ctx: RequestContext) -> HoldersResult:
        # The whole quiescence check (every probe plugged into the lifecycle: mounts too).
        found = await hooks.holders(_workspace_ref(p.workspace_id))
        return HoldersResult(
            holders=[HolderInfo.model_validate(h.as_dict()) for h in found],
            message=busy_message(found) if found else None,
        )

    # -- lease.* -------------------------------------------------------------------------------

    def _lease_info(lease: Any, live: bool) -> LeaseInfo:
        return LeaseInfo.model_validate(lease.as_info(live))

    async def lease_acquire(p: AcquireParams, ctx: RequestContext) -> LeaseResult:
        async with admit(p.workspace_id) as ref:
            try:
                lease, created = leases.acquire_external(
                    workspace_id=ref.id, kind=p.kind, pid=p.pid, label=p.label
                )
            except LookupError as exc:
                raise XumError(ErrorKind.INVALID_PARAMS, str(exc), pid=p.pid) from None
        return LeaseResult(lease=_lease_info(lease, True), created=created)

    async def lease_release(p: LeaseRef, ctx: RequestContext) -> ReleaseResult:
        check_id(p.lease_id, LEASE_PREFIX, "lease")
        lease = leases.get(p.lease_id)
        if lease is None:
            raise XumError(ErrorKind.NOT_FOUND, f"lease {p.lease_id!r} not found", id=p.lease_id)
        if lease.process_id and lease.process_id in sup.procs:
            raise XumError(
                ErrorKind.INVALID_STATE,
                f"lease {p.lease_id} covers process {lease.process_id}; stop it with process.stop",
                process_id=lease.process_id,
            )
        leases.remove(lease.id)
        return ReleaseResult(released=lease.id)

    async def lease_list(p: LeaseListParams, ctx: RequestContext) -> LeaseListResult:
        _known_workspace(p.workspace_id)
        sup.settle(p.workspace_id)
        live, reclaimed = leases.reclaim_dead(p.workspace_id, skip=sup.owns)
        return LeaseListResult(
            leases=[_lease_info(x, True) for x in live], reclaimed=[x.id for x in reclaimed]
        )

    app.router.add(PROCESS_SPAWN, spawn)
    app.router.add(PROCESS_LIST, list_)
    app.router.add(PROCESS_GET, get)
    app.router.add(PROCESS_OUTPUT, output)
    app.router.add(PROCESS_WRITE, write)
    app.router.add(PROCESS_RESIZE, resize)
    app.router.add(PROCESS_SIGNAL, signal_)
    app.router.add(PROCESS_WAIT, wait)
    app.router.add(PROCESS_STOP, stop)
    app.router.add(PROCESS_BACKGROUND, background)
    app.router.add(PROCESS_RELEASE_ALL, release_all)
    app.router.add(PROCESS_HOLDERS, holders)
    app.router.add(LEASE_ACQUIRE, lease_acquire)
    app.router.add(LEASE_RELEASE, lease_release)
    app.router.add(LEASE_LIST, lease_list)
    return sup
