"""The process supervisor: spawn, watch, talk to, stop and adopt supervised processes.

Rules it keeps (design invariants 3 and 5):
- a spawn writes the lease (durable) before the program runs (see `spawn.py`'s start gate), in the
  workspace's shared reservation, so it can only start in an active workspace;
- every wait is bounded; a stop is SIGTERM to the group, then SIGKILL of the whole tree after the
  grace, then confirmation by the exit status or, when that never comes, by a probe;
- a process whose exit is unconfirmed stays a holder (`pending_stop`) of its workspace only.

Keeping processes across a daemon restart (`keep_processes`; docs/PROCESSES.md has the whole
design): agents and MCP servers without a PTY are *keepable*. When the daemon keeps processes,
a keepable one is started on durable I/O (durable.py: its output goes to a bounded file under
ROOT, its stdin is a FIFO it holds itself) instead of pipes to the daemon, so the daemon can stop
without the child getting SIGPIPE/EPIPE or EOF. At shutdown it is left running (`process.kept`),
and the next daemon adopts it through its lease (adoption.py), follows the same file with the
same offsets, and writes to the same FIFO. Everything else is stopped at shutdown, with
`stop_reason: "shutdown"` in its exit: terminals and PTYs (the daemon holds the PTY master, and
closing it hangs up the session), and commands (exec: their exit status is the point, and an
adopting daemon is not the parent that can read it; a foreground one is bound to its caller's
connection, which ends with the daemon).
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from xum_protocol.errors import ErrorKind

from xumd import faults, logs
from xumd.errors import XumError
from xumd.events import EventBus
from xumd.lifecycle.ids import check_id
from xumd.lifecycle.seams import WorkspaceRef
from xumd.processes import adoption, durable, probes
from xumd.processes.durable import DurableIO
from xumd.processes.leases import LeaseStore, new_id
from xumd.processes.managed import Managed, default_label, describe_status
from xumd.processes.output_log import OutputLog, hole_punching_problem
from xumd.processes.ring import OutputRing
from xumd.processes.spawn import (
    Child,
    ProgramNotFound,
    resolve_program,
    set_winsize,
    start_child,
)
from xumd.procutil import kill_tree, start_time

log = logs.get("xumd.processes.supervisor")

PROCESS_PREFIX = "proc_"
_ENV_DROP = (
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "XUM_FAULT",
)

AFTER_INTENT = faults.declare("process.spawn.after_intent", "lease written, child not started")
AFTER_RECORD = faults.declare(
    "process.spawn.after_record", "child started and recorded, program gated (not running)"
)
EXIT_UNCONFIRMED = faults.declare(
    "process.exit.unconfirmed",
    "simulate: a process's exit status is never read (only a probe can settle it)",
    simulate=True,
)

Admit = Callable[[str], AbstractAsyncContextManager[WorkspaceRef]]
CONFIRM_S = 2.0
KEEPABLE_KINDS = frozenset({"agent", "mcp"})
"""Kinds that may outlive the daemon (keep_processes), when they run without a PTY."""


def parse_signal(name: str) -> signal.Signals:
    key = name.strip().upper()
    if key.isdigit():
        try:
            return signal.Signals(int(key))
        except ValueError:
            pass
    else:
        try:
            return signal.Signals[key if key.startswith("SIG") else "SIG" + key]
        except KeyError:
            pass
    raise XumError(ErrorKind.INVALID_PARAMS, f"unknown signal {name!r}", signal=name)


def child_env(extra: dict[str, str] | None, **xum: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _ENV_DROP}
    for key, value in (extra or {}).items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise XumError(ErrorKind.INVALID_PARAMS, f"invalid environment variable {key!r}")
        env[key] = value
    env.update(xum)
    return env


class Supervisor:
    def __init__(
        self,
        leases: LeaseStore,
        events: EventBus,
        admit: Admit,
        *,
        grace_s: float = 5.0,
        probe_interval_s: float = 2.0,
        head_bytes: int = 32 * 1024,
        tail_bytes: int = 224 * 1024,
        keep_exited: int = 256,
        io_dir: Path | None = None,
        keep_processes: bool = False,
        output_poll_s: float = 0.1,
    ) -> None:
        self.leases = leases
        self.events = events
        self.admit = admit
        self.grace_s = grace_s
        self.probe_interval_s = probe_interval_s
        self.head_bytes = head_bytes
        self.tail_bytes = tail_bytes
        self.keep_exited = keep_exited
        self.io_dir = io_dir
        self.output_poll_s = output_poll_s
        self.keep_problem: str | None = None
        """Why keep_processes is not in effect although asked for (None: it is, or not asked)."""
        if keep_processes:
            self.keep_problem = (
                "no directory for durable output"
                if io_dir is None
                else hole_punching_problem(io_dir)
            )
            if self.keep_problem:
                log.warning("processes.keep_unavailable", reason=self.keep_problem)
        self.keep_processes = keep_processes and self.keep_problem is None
        self.procs: dict[str, Managed] = {}
        self.stopping = False
        self._tg: anyio.abc.TaskGroup | None = None
        self._serving = anyio.Event()
        self._peers_watched: set[int] = set()
        self.exit_listeners: list[Callable[[Managed], None]] = []

    # -- life of the supervisor --------------------------------------------------------------

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Own the watchers' task group and run the settle loop until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self._serving.set()
            for managed in list(self.procs.values()):
                if managed.child is not None and managed.live_state:
                    tg.start_soon(self._watch, managed)
                elif managed.adopted and managed.live_state:
                    tg.start_soon(self._watch_adopted, managed)
            task_status.started()
            try:
                while True:
                    await anyio.sleep(self.probe_interval_s)
                    self.settle()
                    self.leases.reclaim_dead(skip=self._is_ours)
            finally:
                self._tg = None

    def _is_ours(self, lease: Any) -> bool:
        return bool(lease.process_id and lease.process_id in self.procs)

    def keepable(self, kind: str, pty: bool, foreground: bool) -> bool:
        return self.keep_processes and kind in KEEPABLE_KINDS and not pty and not foreground

    def adopt(self) -> list[Managed]:
        """At start-up: leases of processes a previous daemon spawned. Live ones are adopted
        (reported, stoppable, their durable output followed); dead ones, and dead external
        holders, are reclaimed. A durable process that ended while no daemon ran is kept as an
        exited record, so its output can still be read. Unclaimed output directories go."""
        adopted: list[Managed] = []
        for managed in adoption.adopt(self):
            self.procs[managed.id] = managed
            if managed.live_state:
                adopted.append(managed)
            else:
                self.events.publish("process.exited", process=managed.info())
        if self.io_dir is not None:
            durable.sweep(self.io_dir, {m.id for m in self.procs.values() if m.io is not None})
        self._prune()
        return adopted

    # -- lookup ------------------------------------------------------------------------------

    def get(self, process_id: str) -> Managed:
        check_id(process_id, PROCESS_PREFIX, "process")
        managed = self.procs.get(process_id)
        if managed is None:
            raise XumError(ErrorKind.NOT_FOUND, f"process {process_id!r} not found", id=process_id)
        return managed

    def select(self, workspace_id: str | None = None) -> list[Managed]:
        found = [m for m in self.procs.values() if workspace_id in (None, m.workspace_id)]
        return sorted(found, key=lambda m: (m.started_at, m.id))

    # -- spawn -------------------------------------------------------------------------------

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
        if self._tg is None and not self.stopping:
            # Requests may arrive a moment before the background services run: wait, bounded.
            with anyio.move_on_after(5.0):
                await self._serving.wait()
        if self.stopping or self._tg is None:
            raise XumError(ErrorKind.SHUTTING_DOWN, "the process supervisor is not running")
        if not argv or any("\0" in arg for arg in argv) or not argv[0]:
            raise XumError(ErrorKind.INVALID_PARAMS, "argv must be a non-empty program and args")
        if foreground_peer is not None and kind not in ("exec", "terminal"):
            raise XumError(ErrorKind.INVALID_PARAMS, f"a {kind} cannot run in the foreground")
        if (cols or rows) and not pty:
            raise XumError(ErrorKind.INVALID_PARAMS, "cols/rows need pty: true")
        process_id = new_id(PROCESS_PREFIX)
        async with self.admit(workspace_id) as ref:
            checkout = Path(ref.path)
            if not checkout.is_dir():
                raise XumError(
                    ErrorKind.INVALID_STATE,
                    f"the checkout of workspace {ref.name!r} is missing: {checkout}",
                    id=workspace_id,
                )
            extra = {"XUM_WORKSPACE_ID": ref.id, "XUM_PROCESS_ID": process_id}
            if pty:
                extra.setdefault("TERM", (env or {}).get("TERM") or "xterm-256color")
            full_env = child_env(env, **extra)
            try:
                resolve_program(argv[0], path_env=full_env.get("PATH"), cwd=checkout)
            except ProgramNotFound as exc:
                raise XumError(ErrorKind.INVALID_PARAMS, str(exc), program=argv[0]) from None
            label = label or default_label(kind, argv)
            keep = self.keepable(kind, pty, foreground_peer is not None)
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
            AFTER_INTENT()
            io: DurableIO | None = None
            try:
                if keep:
                    assert self.io_dir is not None
                    io = DurableIO.create(self.io_dir, process_id)
                child = _start_on(
                    io, argv, checkout, full_env, pty=pty, cols=cols or 80, rows=rows or 24
                )
            except OSError as exc:
                if io is not None:
                    io.remove()
                self.leases.remove(lease.id, reason="spawn failed")
                raise XumError(
                    ErrorKind.OPERATION_FAILED, f"cannot start {argv[0]}: {exc.strerror or exc}"
                ) from None
            try:
                started = start_time(child.pid)
                self.leases.record_pid(lease.id, child.pid, child.pid, started)
                AFTER_RECORD()
                child.open_gate()
                ring = (
                    io.open_log(head_limit=self.head_bytes, tail_limit=self.tail_bytes)
                    if io is not None
                    else OutputRing(self.head_bytes, self.tail_bytes)
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
            self.procs[process_id] = managed
            self._tg.start_soon(self._watch, managed)
        log.info("process.started", process=process_id, pid=child.pid, kind=kind, workspace=ref.id)
        self.events.publish("process.started", process=managed.info())
        return managed

    # -- watching ----------------------------------------------------------------------------

    async def _watch(self, managed: Managed) -> None:
        child = managed.child
        assert child is not None
        reader_done = anyio.Event()
        returncode: int | None = None
        try:
            async with anyio.create_task_group() as tg:
                reader = anyio.CancelScope()
                if isinstance(managed.ring, OutputLog):
                    tg.start_soon(self._follow, managed.ring, reader)
                    reader_done.set()
                else:
                    tg.start_soon(self._read_output, managed, reader, reader_done)
                returncode = await _wait_exit(child.popen)
                # A descendant may hold the output open: read what is there, briefly.
                with anyio.move_on_after(0.5):
                    await reader_done.wait()
                reader.cancel()
        except Exception:
            log.exception("process.watch_failed", process=managed.id)
        finally:
            if child.output_fd is not None:
                with contextlib.suppress(Exception):
                    anyio.notify_closing(child.output_fd)
            child.close_all()
            if not isinstance(managed.ring, OutputLog):
                managed.ring.close()  # a log is closed at the exit (a kept one never is)
        if returncode is None or EXIT_UNCONFIRMED.active:
            # The exit status could not be read: the settle probe decides (fail closed).
            managed.confirm_lost = True
            log.warning("process.exit_unconfirmed", process=managed.id, pid=managed.pid)
            return
        code, sig = describe_status(returncode)
        # The group does not outlive its leader: leftovers are stopped before the lease goes.
        if managed.pgid and probes.group_members(managed.pgid):
            with anyio.CancelScope(shield=True):
                await kill_tree(managed.pid or 0, managed.pgid, self.grace_s)
        self._finish(managed, code, sig, "exit")

    async def _follow(self, output: OutputLog, scope: anyio.CancelScope) -> None:
        with scope:
            await output.follow(self.output_poll_s)

    async def _watch_adopted(self, managed: Managed) -> None:
        """Not our child: its output is followed in its file, and its end is noticed through a
        pidfd (any process can be watched, not only a child) and settled by the probe (its
        group may outlive it). A process that survives its leader is settled by the loop."""
        async with anyio.create_task_group() as tg:
            follower = anyio.CancelScope()
            if isinstance(managed.ring, OutputLog):
                tg.start_soon(self._follow, managed.ring, follower)
            if managed.pid:
                await adoption.leader_gone(managed.pid, managed.start_time)
                self.settle(managed.workspace_id)
            await managed.exited.wait()
            follower.cancel()

    async def _read_output(
        self, managed: Managed, scope: anyio.CancelScope, done: anyio.Event
    ) -> None:
        child, ring = managed.child, managed.ring
        assert child is not None and child.output_fd is not None
        assert isinstance(ring, OutputRing)
        fd = child.output_fd
        with scope:
            while True:
                try:
                    await anyio.wait_readable(fd)
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                except (OSError, anyio.ClosedResourceError):
                    break  # EIO: the PTY's other side is closed
                if not data:
                    break
                ring.feed(data)
        done.set()

    def _finish(self, managed: Managed, code: int | None, sig: str | None, settled_by: str) -> None:
        if managed.state == "exited":
            return
        if managed.lease_id:
            self.leases.remove(managed.lease_id, reason=f"exited ({settled_by})")
        managed.state = "exited"
        managed.exit = {"code": code, "signal": sig, "settled_by": settled_by, "at": time.time()}
        if managed.stop_reason:
            managed.exit["stop_reason"] = managed.stop_reason
        managed.ring.close()
        if managed.io is not None:
            managed.io.close_writer()
        managed.exited.set()
        log.info("process.exited", process=managed.id, code=code, signal=sig, settled_by=settled_by)
        self.events.publish("process.exited", process=managed.info())
        self._prune()
        for listener in self.exit_listeners:
            try:
                listener(managed)
            except Exception:
                log.exception("process.exit_listener_failed", process=managed.id)

    def _mark_pending(self, managed: Managed) -> None:
        """A stop whose exit is not confirmed yet. Durable (in the lease), so that a restarted
        daemon still reports it as `pending_stop` until a probe settles it."""
        managed.state = "pending_stop"
        if managed.lease_id:
            self.leases.update_detail(managed.lease_id, stop_requested=True)

    def _prune(self) -> None:
        """Keep the newest exited processes only (their output and exit), so memory is bounded."""
        exited = [m for m in self.procs.values() if not m.live_state]
        for managed in sorted(exited, key=lambda m: m.exit["at"] if m.exit else 0)[
            : max(0, len(exited) - self.keep_exited)
        ]:
            del self.procs[managed.id]
            if managed.io is not None:
                managed.io.remove()

    def settle(self, workspace_id: str | None = None) -> list[Managed]:
        """Settle, by probe, the processes whose exit nobody will confirm (adopted ones, lost
        confirmations): gone when neither the pid with its start time nor its group lives."""
        settled: list[Managed] = []
        for managed in self.select(workspace_id):
            if not managed.live_state or not managed.confirm_lost:
                continue
            if probes.holder_alive(managed.pid, managed.start_time, managed.pgid):
                continue
            self._finish(managed, None, None, "unknown" if managed.adopted else "probe")
            settled.append(managed)
        return settled

    # -- talking to it -----------------------------------------------------------------------

    async def output(
        self, managed: Managed, since: int, wait_s: float, max_bytes: int, encoding: str
    ) -> dict[str, Any]:
        if isinstance(managed.ring, OutputLog) and not managed.ring.closed:
            managed.ring.refresh()  # what was written since the last poll, at no cost
        if wait_s > 0 and managed.ring.total <= since and managed.live_state:
            with anyio.move_on_after(wait_s):
                await managed.ring.wait_beyond(since, wait_s)
                if managed.ring.closed and managed.live_state:
                    # Output ended: the exit follows at once (or the probe settles it).
                    with anyio.move_on_after(max(0.0, wait_s)):
                        await managed.exited.wait()
        chunk = managed.ring.read(since, max_bytes)
        data = (
            base64.b64encode(chunk.data).decode()
            if encoding == "base64"
            else chunk.data.decode(errors="replace")
        )
        end = chunk.start + len(chunk.data)
        return {
            "data": data,
            "encoding": encoding,
            "start": chunk.start,
            "next": end,
            "dropped": chunk.dropped,
            "dropped_total": managed.ring.dropped,
            "exited": not managed.live_state and end >= managed.ring.total,
            "exit": managed.exit,
            "source": managed.output_source,
        }

    def _require_child(self, managed: Managed, what: str) -> Any:
        if not managed.live_state:
            raise XumError(ErrorKind.INVALID_STATE, f"process {managed.id} has exited")
        if managed.child is None or managed.child.input_fd is None:
            reason = "it was adopted after a restart" if managed.adopted else "its input is closed"
            raise XumError(ErrorKind.INVALID_STATE, f"cannot {what} process {managed.id}: {reason}")
        return managed.child

    def _input_fd(self, managed: Managed, eof: bool) -> int:
        """Where `process.write` goes: the durable stdin FIFO, or the pipe / PTY master."""
        if managed.io is None:
            fd: int = self._require_child(managed, "write to").input_fd
            return fd
        if not managed.live_state:
            raise XumError(ErrorKind.INVALID_STATE, f"process {managed.id} has exited")
        if eof:
            raise XumError(
                ErrorKind.INVALID_STATE,
                f"the stdin of process {managed.id} cannot be closed: it may outlive the daemon, "
                "so it reads a FIFO it holds open itself (it never ends); end the input in-band, "
                "or stop the process",
                process_id=managed.id,
            )
        try:
            return managed.io.writer()
        except OSError as exc:
            raise XumError(
                ErrorKind.INVALID_STATE,
                f"process {managed.id} no longer reads its input: {exc.strerror or exc}",
            ) from None

    async def write(self, managed: Managed, data: bytes, eof: bool) -> int:
        fd = self._input_fd(managed, eof)
        view = memoryview(data)
        written = 0
        with anyio.move_on_after(10) as scope:
            while written < len(view):
                try:
                    written += os.write(fd, view[written:])
                except BlockingIOError:
                    await anyio.wait_writable(fd)
                except OSError as exc:
                    raise XumError(
                        ErrorKind.INVALID_STATE,
                        f"process {managed.id} input closed: {exc.strerror}",
                    ) from None
        if scope.cancelled_caught:
            raise XumError(
                ErrorKind.TIMEOUT,
                f"timed out writing to process {managed.id} (it does not read its input)",
                waited_for="process input",
                written=written,
            )
        if eof:
            child = managed.child
            assert child is not None  # durable stdin refused eof above
            if child.pty:
                os.write(fd, b"\x04")
            else:
                child.close_input()
        return written

    def resize(self, managed: Managed, cols: int, rows: int) -> None:
        if not managed.pty:
            raise XumError(ErrorKind.INVALID_STATE, f"process {managed.id} has no PTY")
        child = self._require_child(managed, "resize")
        # The kernel sends SIGWINCH to the terminal's foreground process group itself.
        set_winsize(child.input_fd, cols, rows)

    def signal(self, managed: Managed, sig: signal.Signals) -> None:
        if not managed.live_state or not managed.pgid:
            raise XumError(ErrorKind.INVALID_STATE, f"process {managed.id} has exited")
        try:
            os.killpg(managed.pgid, sig)
        except ProcessLookupError:
            raise XumError(ErrorKind.INVALID_STATE, f"process {managed.id} is gone") from None

    async def wait(self, managed: Managed, timeout_s: float) -> Managed:
        with anyio.move_on_after(timeout_s):
            await managed.exited.wait()
        if managed.live_state:
            raise XumError(
                ErrorKind.TIMEOUT,
                f"process {managed.id} still {managed.state} after {timeout_s}s",
                waited_for=f"exit of {managed.id}",
                state=managed.state,
            )
        return managed

    # -- stopping ----------------------------------------------------------------------------

    async def stop(
        self, managed: Managed, grace_s: float | None = None, reason: str = "request"
    ) -> Managed:
        """SIGTERM to the group, SIGKILL to the whole tree after the grace, then confirm.
        `reason` (request, session, release, shutdown) goes into the exit as `stop_reason`."""
        if not managed.live_state:
            return managed
        grace = self.grace_s if grace_s is None else grace_s
        managed.stop_reason = managed.stop_reason or reason
        if managed.state == "running":
            managed.state = "stopping"
            self.events.publish("process.stopping", process=managed.info())
        if managed.pid:
            # Not shielded: a caller's deadline (release_all, shutdown) bounds the whole stop;
            # a stop cut short leaves the process reported as still running, never waited on.
            await kill_tree(managed.pid, managed.pgid, grace)
        with anyio.move_on_after(CONFIRM_S):
            await managed.exited.wait()
        if managed.live_state:
            self.settle(managed.workspace_id)
        if managed.live_state:
            self._mark_pending(managed)
            log.warning("process.stop_unconfirmed", process=managed.id, pid=managed.pid)
        return managed

    async def stop_many(
        self, targets: list[Managed], deadline_s: float, reason: str = "release"
    ) -> list[Managed]:
        """Stop these concurrently within the deadline; returns those still not exited."""
        # Leave room after the grace for the SIGKILL (bounded at 2s) and the confirmation.
        grace = min(self.grace_s, max(deadline_s - CONFIRM_S - 2.5, deadline_s / 4))
        with anyio.move_on_after(deadline_s):
            async with anyio.create_task_group() as tg:
                for managed in targets:
                    tg.start_soon(self.stop, managed, grace, reason)
        left = [m for m in targets if m.live_state]
        for managed in left:
            # Cut short by the deadline: an unconfirmed stop, reported, blocking cleanup.
            self._mark_pending(managed)
        return left

    async def release_all(
        self, workspace_id: str, deadline_s: float
    ) -> tuple[list[str], list[Managed]]:
        targets = [m for m in self.select(workspace_id) if m.live_state]
        left = await self.stop_many(targets, deadline_s)
        return [m.id for m in targets if not m.live_state], left

    # -- foreground and background -----------------------------------------------------------

    def watch_peer(self, peer: Any) -> None:
        if peer.id in self._peers_watched:
            return
        self._peers_watched.add(peer.id)
        peer.on_close(lambda: self._peer_closed(peer.id))

    def _peer_closed(self, peer_id: int) -> None:
        self._peers_watched.discard(peer_id)
        targets = [m for m in self.procs.values() if m.foreground_peer == peer_id and m.live_state]
        if targets and self._tg is not None:
            log.info("process.session_released", peer=peer_id, processes=[m.id for m in targets])
            self._tg.start_soon(self._release_session, peer_id, targets)

    async def _release_session(self, peer_id: int, targets: list[Managed]) -> None:
        """Bounded: what still runs afterwards is reported (logged, and `pending_stop`)."""
        left = await self.stop_many(targets, self.grace_s + CONFIRM_S + 4.0, "session")
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
            self._mark_pending(managed)
            self.events.publish("process.stopping", process=managed.info())
            if self._tg is not None:
                self._tg.start_soon(self.stop, managed, None, "session")
        refusal.data.update(process_id=managed.id, state=managed.state)
        raise refusal

    # -- shutdown ----------------------------------------------------------------------------

    async def shutdown(self, deadline_s: float) -> list[Managed]:
        """Stop every process, bounded, except those kept (`on_daemon_stop: keep`), which are
        left running for the next daemon to adopt. Returns what is still running unkept."""
        self.stopping = True
        live = [m for m in self.procs.values() if m.live_state]
        targets = [m for m in live if m.on_daemon_stop != "keep"]
        left = await self.stop_many(targets, deadline_s, "shutdown")
        for managed in live:
            if managed.on_daemon_stop == "keep":
                if managed.io is not None:
                    managed.io.close_writer()
                log.info("process.kept", process=managed.id, pid=managed.pid, kind=managed.kind)
                self.events.publish("process.kept", process=managed.info())
        # Exited records live in this daemon's memory only: their output files go with them.
        for managed in self.procs.values():
            if managed.io is not None and not managed.live_state:
                managed.io.remove()
        return left


async def _wait_exit(popen: Any) -> int:
    """The child's exit status, without a thread: a pidfd becomes readable when it exits."""
    try:
        pidfd = os.pidfd_open(popen.pid)
    except (OSError, AttributeError):
        pidfd = None
    if pidfd is not None:
        try:
            while popen.poll() is None:
                with anyio.move_on_after(1.0):
                    await anyio.wait_readable(pidfd)
        finally:
            with contextlib.suppress(Exception):
                anyio.notify_closing(pidfd)
            os.close(pidfd)
    else:
        while popen.poll() is None:
            await anyio.sleep(0.05)
    return int(popen.returncode)


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
