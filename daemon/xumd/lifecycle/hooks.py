"""Seams between the lifecycle and the features above it that plug into it.

The lifecycle service owns structural mutations. Features above it (processes, recovery) plug in
here, so that the lifecycle never imports them:
- the processes feature (`ProcessHolders`) says who uses a checkout, for `busy` refusals (with
  the mounts at or under it, which the lifecycle finds itself), and stops the daemon's own
  processes in a workspace (archive with `stop: true`);
- recovery settles a kept rename journal on `workspace.keep` (the rename settler), and the row of
  an operation that failed part-way (the row settler, which the coordinator's failure guard
  takes: `xumd.lifecycle.context.FailureGuard`).
The composition root builds `LifecycleHooks` from them and hands it to the workspace service.
(Cleanup, below the lifecycle, is used directly: the lifecycle is handed its `CleanupService`.)
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio

from xumd.checkouts.marker import WorkspaceRef
from xumd.system import fsdelete


@dataclass(frozen=True, slots=True)
class Holder:
    """Someone using a checkout: `kind` is e.g. terminal, agent, mcp, exec, editor, setup,
    teardown, process (found by the cwd/open-file probe), pending_stop, mount (a mount point at
    or under the checkout; `pid` None, the label names the mount point)."""

    kind: str
    pid: int | None
    label: str
    since: float | None = None
    process_id: str | None = None
    """The supervised process (proc_...), when the daemon started it."""
    command: str | None = None
    """Its command line (shell-quoted, bounded), when known."""

    def describe(self) -> str:
        """`agent in pid 12373 (proc_…, `claude`; free it: `xum kill proc_…`)`."""
        hint = self.free_hint()
        if not self.pid:
            label = printable(self.label)
            return f"{label} ({hint})" if hint else label
        details = [d for d in (self.process_id, self.command and f"`{self.command}`") if d]
        text = f"{self._named()} in pid {self.pid}"
        if details:
            text += " (" + ", ".join(details) + (f"; free it: {hint})" if hint else ")")
        elif hint:
            text += f" (free it: {hint})"
        return text

    def _named(self) -> str:
        """Its kind and label (`exec make`, `process vim`), the kind once when the label
        already says it (`agent`, `terminal`, `MCP server`, a pending stop's own label)."""
        label = printable(self.label or self.kind)
        said = label.lower().startswith(self.kind.lower()) or self.kind in ("mcp", "pending_stop")
        return label if said else f"{self.kind} {label}"

    def free_hint(self) -> str | None:
        """How the user frees the checkout of this holder (None: nothing to say)."""
        if self.process_id:
            return f"`xum kill {self.process_id}`"
        if self.kind == "mount":
            return "unmount it"
        if self.pid:
            return f"end pid {self.pid}"
        return None

    def as_dict(self) -> dict[str, object]:
        found: dict[str, object] = {
            "kind": self.kind,
            "pid": self.pid,
            "label": self.label,
            "since": self.since,
        }
        # Additive fields, present only when known (a mount or probe holder has neither).
        if self.process_id is not None:
            found["process_id"] = self.process_id
        if self.command is not None:
            found["command"] = self.command
        return found


COMMAND_MAX = 200
"""A holder's command line is cut here: a message names it, it does not reproduce it."""


def printable(text: str) -> str:
    """`text` with each control character escaped: a program picks its own argv and name, and
    an escape sequence or a newline would otherwise reach the terminal showing the message."""
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def command_line(argv: list[str]) -> str | None:
    """`argv` as one shell-quoted line, bounded (None: nothing known)."""
    if not argv:
        return None
    line = printable(shlex.join(argv))
    return line if len(line) <= COMMAND_MAX else line[: COMMAND_MAX - 1] + "…"


async def mount_holders(workspace: WorkspaceRef) -> list[Holder]:
    """Mounts at or under the checkout: deleting or moving it would reach into them (a bind
    mount's files are not the checkout's), so they hold it like a process does."""
    return await mounts_holding(workspace.path)


async def mounts_holding(path: Path) -> list[Holder]:
    """Mounts at or under `path`, as holders; an unreadable mount table is a `probe` holder."""
    try:
        points = await anyio.to_thread.run_sync(fsdelete.mounts_at_or_under, path)
    except OSError as exc:
        # Fail closed: an unreadable mount table cannot prove that no mount is inside.
        return [Holder("probe", None, f"mount table unreadable: {exc.strerror or exc}")]
    return [Holder("mount", None, f"mount at {point}") for point in points]


RenameSettler = Callable[[str], Awaitable[str | None]]
"""Settle a workspace's kept rename journal by what the disk shows (recovery's startup logic for
one row; the caller holds the exclusive reservation). Returns the problem the row stays flagged
with (None: settled cleanly); raises `invalid_state`, changing nothing, when the disk proves
neither state."""

RowSettler = Callable[[str, str], str | None]
"""Settle one workspace row left mid-way by a failed operation (workspace id, the failure), as
the startup pass would after a crash at that point: roll back or forward when the disk proves
which, else flag it `interrupted` with the failure in the reason. Synchronous (store and lstat
only), so it runs even in a cancelled task. Returns the action taken (None: nothing to do)."""


class ProcessHolders(Protocol):
    """The processes feature's quiescence check (`xumd.processes.quiescence.Quiescence`)."""

    async def holders(self, ref: WorkspaceRef) -> list[Holder]: ...

    async def stop(self, ref: WorkspaceRef, deadline_s: float) -> tuple[list[str], list[Holder]]:
        """Stop the daemon's own processes in the workspace within the deadline; return the
        ids of the processes it stopped and what is left."""
        ...


@dataclass(frozen=True, slots=True)
class LifecycleHooks:
    """What the features above the lifecycle plug into it, all required and fixed at
    construction. The composition root builds what they come from before the workspace service
    that holds them: the processes feature's supervisor admits through the coordinator (built
    first), not the service, and recovery's reconciler publishes and plans through ports the
    lifecycle builds without the service, so nothing here is assigned after the fact and a graph
    without one fails with a `TypeError` while it is built."""

    processes: ProcessHolders
    rename_settler: RenameSettler

    async def holders(self, workspace: WorkspaceRef) -> list[Holder]:
        return await mount_holders(workspace) + await self.processes.holders(workspace)

    async def stop_all(
        self, workspace: WorkspaceRef, deadline_s: float
    ) -> tuple[list[str], list[Holder]]:
        """The ids of the processes stopped, and the holders left."""
        return await self.processes.stop(workspace, deadline_s)


def holders_text(holders: list[Holder]) -> str:
    """Each holder once, by kind, pid, process id and command line, with how to free it."""
    return "; ".join(h.describe() for h in holders)


def busy_message(holders: list[Holder]) -> str:
    """The holders, for a message whose error kind already says `busy` (said once)."""
    return "in use by " + holders_text(holders)
