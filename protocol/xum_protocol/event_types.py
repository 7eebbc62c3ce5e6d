"""Every event type the daemon publishes, with its `data` fields: the catalog that
docs/PROTOCOL.md is generated from (`make schema`). A test scans the daemon's `publish(...)`
calls, so a new type (or a new field at a call site) that is not listed here fails."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EventType:
    type: str
    summary: str
    data: dict[str, str]
    """Field name -> what it holds. A trailing `?` on the name: present only sometimes."""


WORKSPACE = "the workspace (`WorkspaceInfo`, as `workspace.get` answers)"
PROCESS = "the process (`ProcessInfo`, as `process.get` answers)"
SCRIPT = {
    "workspace_id": "the workspace whose script runs",
    "project_id": "its project",
    "name": "the workspace's name",
    "phase": "`setup` (teardown runs in cleanup and is not streamed)",
    "index": "0-based index of the command in the `[scripts]` list",
}

EVENT_TYPES: tuple[EventType, ...] = (
    EventType(
        "project.added", "A project was registered.", {"project": "the project (`ProjectInfo`)"}
    ),
    EventType(
        "project.trusted",
        "A project's `.xum/config.toml` hash was trusted.",
        {"project": "the project (`ProjectInfo`, with `trusted_config_hash`)"},
    ),
    EventType(
        "project.removed",
        "A project was removed (after all its workspaces).",
        {"project_id": "its id", "name": "its name"},
    ),
    EventType(
        "workspace.created",
        "The intent of a create was committed (state `creating`); nothing is on disk yet.",
        {"workspace": WORKSPACE},
    ),
    EventType(
        "workspace.updated",
        "A field other than the state changed (setup started: `setup.status` `running`).",
        {"workspace": WORKSPACE},
    ),
    EventType(
        "workspace.state_changed",
        "A committed state change: `creating` → `active`, `archiving`, `archived`, `restoring`, "
        "`removing`, a rollback, or a repair by the start-up recovery pass.",
        {
            "workspace": WORKSPACE,
            "recovered?": "the recovery pass's action (`completed`, `unarchive_rolled_back`, ...)",
        },
    ),
    EventType(
        "workspace.renamed",
        "A rename was committed (name, path, and the default branch).",
        {"workspace": WORKSPACE, "previous_name": "the name before"},
    ),
    EventType(
        "workspace.interrupted",
        "The recovery pass (or a rename whose undo failed) flagged a workspace for the user.",
        {"workspace": WORKSPACE, "reason": "what was interrupted and what to do"},
    ),
    EventType(
        "workspace.removed",
        "The row is gone: a committed removal (its cleanup may still be pending), or an undone "
        "create.",
        {
            "workspace_id": "its id",
            "project_id?": "its project (a removal)",
            "name?": "its name (a removal)",
            "reason?": "`create failed` (an undone create)",
        },
    ),
    EventType(
        "workspace.auto_archive",
        "An auto-archive attempt (`auto_archive: on_agent_exit`) ended.",
        {"workspace_id": "the workspace", "outcome": "`AutoArchiveOutcome` as a dict"},
    ),
    EventType(
        "script.started",
        "A setup command starts (published while `workspace.create`/`unarchive` wait).",
        {**SCRIPT, "count": "how many commands the phase has", "command": "the command text"},
    ),
    EventType(
        "script.printed",
        "Lines a setup command printed (bounded: line length and lines per run).",
        {**SCRIPT, "lines": "the lines, decoded (invalid UTF-8 replaced)"},
    ),
    EventType(
        "cleanup.obligation_changed",
        "A cleanup obligation was planned, attempted, completed, abandoned or failed.",
        {"obligation": "the obligation (`Obligation`, as `cleanup.list` answers)"},
    ),
    EventType("process.started", "A supervised process started.", {"process": PROCESS}),
    EventType(
        "process.adopted",
        "A process kept across a daemon restart was found alive and adopted.",
        {"process": PROCESS},
    ),
    EventType(
        "process.stopping",
        "A stop began (SIGTERM sent; SIGKILL after the grace).",
        {"process": PROCESS},
    ),
    EventType(
        "process.backgrounded",
        "A foreground exec was detached from its caller.",
        {"process": PROCESS},
    ),
    EventType(
        "process.kept",
        "Left running at the daemon's stop (keep_processes), for adoption at the next start.",
        {"process": PROCESS},
    ),
    EventType(
        "process.exited",
        "A supervised process ended (`exit` says how it was settled).",
        {"process": PROCESS},
    ),
    EventType(
        "lease.acquired",
        "A use lease on a workspace's checkout was taken (or its holder updated).",
        {"lease": "the lease (`LeaseInfo`)"},
    ),
    EventType(
        "lease.released",
        "A lease was removed.",
        {"lease": "the lease (`LeaseInfo`)", "reason": "`released`, `holder gone`, ..."},
    ),
    EventType(
        "turn.created",
        "A delegated turn was opened (its target workspace bound to it).",
        {"turn": "the turn (`TurnInfo`)"},
    ),
    EventType("turn.ended", "A delegated turn was ended.", {"turn": "the turn (`TurnInfo`)"}),
)

BY_TYPE: dict[str, EventType] = {e.type: e for e in EVENT_TYPES}
