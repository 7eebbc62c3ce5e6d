"""Watching a supervised process: reading its output while it runs, and noticing its end.

A child of this daemon is watched through its exit status (a pidfd, no thread); its leftovers in
the group are stopped before its lease goes, since the group must not outlive its leader. An
adopted process is not our child: its end is noticed through a pidfd on its pid and settled by
the probe. When the exit status cannot be read, the settle loop's probe decides (fail closed).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import anyio

from xumd.base import faults, logs
from xumd.processes import probes
from xumd.processes.managed import Managed, describe_status
from xumd.processes.output_log import OutputLog
from xumd.processes.ring import OutputRing
from xumd.processes.settlement import Settlement
from xumd.processes.state import SupervisorSettings
from xumd.system import containment
from xumd.system.platform import current
from xumd.system.procutil import kill_tree

log = logs.get("xumd.processes.watching")

EXIT_UNCONFIRMED = faults.declare(
    "process.exit.unconfirmed",
    "simulate: a process's exit status is never read (only a probe can settle it)",
    simulate=True,
)


class Watcher:
    def __init__(self, settlement: Settlement, settings: SupervisorSettings) -> None:
        self.settlement = settlement
        self.settings = settings

    async def watch(self, managed: Managed) -> None:
        """Our child: read its output, wait for its exit status, then settle it."""
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
                returncode = await wait_exit(child.popen)
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
        # The group does not outlive its leader: leftovers are stopped before the lease goes,
        # and so are descendants that left the group (they carry the process's marker). Never
        # silently: the exit names each one (a dev server started in the background of an
        # `xum run` would otherwise just vanish).
        stopped: list[containment.Stopped] = []
        with anyio.CancelScope(shield=True):
            if managed.pgid and probes.group_members(managed.pgid):
                await kill_tree(
                    managed.pid or 0, managed.pgid, self.settings.grace_s, stopped=stopped
                )
            await stop_marked_leftovers(self.settings, managed, stopped)
        # Stopped by the daemon (process.stop, a release, a shutdown): its tree went with that
        # stop, which the exit's stop_reason already says; these are not things it left.
        if stopped and not managed.stop_reason:
            managed.leftovers = [s.describe() for s in stopped]
            log.info(
                "process.leftovers_stopped",
                process=managed.id,
                pids=[s.pid for s in stopped],
            )
        self.settlement.finish(managed, code, sig, "exit")

    async def watch_adopted(self, managed: Managed) -> None:
        """Not our child: its output is followed in its file, and its end is noticed through a
        pidfd (any process can be watched, not only a child) and settled by the probe (its
        group may outlive it). A process that survives its leader is settled by the loop."""
        async with anyio.create_task_group() as tg:
            follower = anyio.CancelScope()
            if isinstance(managed.ring, OutputLog):
                tg.start_soon(self._follow, managed.ring, follower)
            if managed.pid:
                await probes.leader_gone(managed.pid, managed.start_time)
                self.settlement.settle(managed.workspace_id)
            await managed.exited.wait()
            follower.cancel()

    async def _follow(self, output: OutputLog, scope: anyio.CancelScope) -> None:
        with scope:
            await output.follow(self.settings.output_poll_s)

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


async def stop_marked_leftovers(
    settings: SupervisorSettings,
    managed: Managed,
    stopped: list[containment.Stopped] | None = None,
) -> None:
    """Stop what still carries the process's marker (double-forked descendants included);
    `stopped` is told what ended."""
    cont = settings.containment
    if cont is not None:
        await cont.leftovers(
            cont.marker(managed.id), settings.grace_s, always=False, stopped=stopped
        )


async def wait_exit(popen: Any) -> int:
    """The child's exit status, without a thread: a pidfd becomes readable when it exits."""
    try:
        pidfd = current().pidfd_open(popen.pid)
    except OSError:
        pidfd = None
    if pidfd is not None:
        try:
            while popen.poll() is None:
                with anyio.move_on_after(1.0):
                    await anyio.wait_readable(pidfd)
            containment.waited(popen.pid)
        finally:
            with contextlib.suppress(Exception):
                anyio.notify_closing(pidfd)
            os.close(pidfd)
    else:
        while popen.poll() is None:
            await anyio.sleep(0.05)
    return int(popen.returncode)
