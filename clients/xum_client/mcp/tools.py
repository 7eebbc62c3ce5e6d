"""The MCP tools: one table maps each tool to its daemon method, its params and result models
(the protocol's own, so each tool's input and output JSON Schema is the protocol's, never
written twice) and its annotations; and how an answer or an error becomes a tool result.

A tool's arguments go to the daemon as they are: the daemon validates them with the same
models, so wrong types, unknown fields and bad names get the protocol's own error kinds
(`invalid_params`, `invalid_name`). Only the two tools the daemon has no one method for
(`run_command`, `current_workspace`) are checked here first, against their models below, which
are made of the protocol's fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, create_model
from xum_protocol.method_names import MUTATING
from xum_protocol.methods import METHODS
from xum_protocol.models.base import Params, Result
from xum_protocol.models.daemon import EmptyParams
from xum_protocol.models.process import (
    OutputParams,
    ProcessExit,
    ProcessInfo,
    SpawnParams,
    WaitParams,
)
from xum_protocol.models.workspace import WorkspaceInfo
from xum_protocol.request_keys import FIELD, json_schema

from xum_client.errors import (
    ClientTimeout,
    ConnectionLost,
    DaemonNotRunning,
    HostError,
    VersionMismatch,
    XumRpcError,
)

INTERNAL_ERROR = -32603

LONG_S = 3600.0
"""Calls that run setup or teardown scripts wait as long as the command line does for them."""


def _fields(model: type[BaseModel], *names: str) -> dict[str, Any]:
    """Fields of a protocol model, to build a tool's model of them (same types, limits and
    descriptions)."""
    return {name: (model.model_fields[name].annotation, model.model_fields[name]) for name in names}


RunCommandParams: type[Params] = create_model(
    "RunCommandParams",
    __base__=Params,
    __doc__="A command run in a workspace's checkout, waited for, its output returned.",
    **_fields(SpawnParams, "workspace_id", "argv", "env"),
    **_fields(WaitParams, "timeout_s"),
    **_fields(OutputParams, "max_bytes"),
)


class RunCommandResult(Result):
    process: ProcessInfo = Field(description="The process as it ended (or was stopped).")
    exit: ProcessExit | None = Field(description="How it ended; null when it could not end.")
    timed_out: bool = Field(
        description="It still ran after `timeout_s`: it was stopped (SIGTERM, then SIGKILL)."
    )
    output: str = Field(
        description="The end of what it wrote (stdout and stderr), at most `max_bytes` bytes "
        "(UTF-8, invalid bytes replaced)."
    )
    output_bytes: int = Field(description="All it wrote, in bytes.")
    output_omitted: int = Field(
        description="Bytes of it not in `output`: the start, cut to keep `max_bytes`, and what "
        "the daemon's output ring no longer held."
    )


class CurrentWorkspaceResult(Result):
    workspace: WorkspaceInfo = Field(description="Its ports and env are `ports` and `env`.")
    processes: list[ProcessInfo] = Field(description="Its supervised processes.")
    found_by: Literal["env", "cwd"] = Field(
        description="`env`: XUM_WORKSPACE_ID named it; `cwd`: its checkout holds the server's "
        "current directory."
    )


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    title: str
    method: str | None
    """The daemon method it is; None: one of the composed tools (`server.py` runs it)."""
    params: type[BaseModel]
    result: type[BaseModel]
    description: str
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    timeout_s: float | None = None
    """The call's deadline when longer than the client's default (scripts run in it)."""

    def input_schema(self) -> dict[str, Any]:
        """The params' schema; a mutating method's tool takes a `request_key` too: an agent
        that names its call retries it safely (the same key: the first call's outcome). Without
        one the client names it, and its own retry after a lost connection reuses that."""
        schema: dict[str, Any] = self.params.model_json_schema()
        if self.method in MUTATING:
            properties = {**schema.get("properties", {}), FIELD: json_schema()}
            schema = {**schema, "properties": properties}
        return schema

    def output_schema(self) -> dict[str, Any]:
        return self.result.model_json_schema()

    def annotations(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "readOnlyHint": self.read_only,
            "destructiveHint": self.destructive,
            "idempotentHint": self.idempotent,
            "openWorldHint": False,
        }


def _method(name: str, title: str, method: str, more: str = "", **flags: Any) -> Tool:
    spec = METHODS[method]
    description = f"{spec.summary} (daemon method `{method}`.)" + (f" {more}" if more else "")
    return Tool(name, title, method, spec.params, spec.result, description, **flags)


READ: dict[str, Any] = {"read_only": True, "idempotent": True}

TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        _method("daemon_status", "Daemon status", "daemon.status", **READ),
        _method("list_projects", "List projects", "project.list", **READ),
        _method(
            "list_workspaces",
            "List workspaces",
            "workspace.list",
            "Each carries its state, `interrupted` flag, last cleanup, ports and env.",
            **READ,
        ),
        _method("show_workspace", "Show a workspace", "workspace.get", **READ),
        _method(
            "create_workspace",
            "Create a workspace",
            "workspace.create",
            "`project_id` from list_projects.",
            timeout_s=LONG_S,
        ),
        _method(
            "archive_workspace",
            "Archive a workspace",
            "workspace.archive",
            "Uncommitted work is saved under a snapshot ref first (the answer's `snapshot`: ref "
            "and files); ignored files not preserved are dropped (`dropped`); the checkout is "
            "deleted (`cleanup`). Refused `busy` while something uses the checkout (the error "
            "names the holders).",
            destructive=True,
            timeout_s=LONG_S,
        ),
        _method(
            "unarchive_workspace",
            "Unarchive a workspace",
            "workspace.unarchive",
            "Recreates the checkout with the saved work.",
            timeout_s=LONG_S,
        ),
        _method(
            "remove_workspace",
            "Remove a workspace",
            "workspace.remove",
            "Without `force`, refused `not_safe` when the checkout holds unsaved work (archive "
            "it instead, or pass force to snapshot it and remove).",
            destructive=True,
            timeout_s=LONG_S,
        ),
        _method("rename_workspace", "Rename a workspace", "workspace.rename", timeout_s=LONG_S),
        Tool(
            "run_command",
            "Run a command in a workspace",
            None,
            RunCommandParams,
            RunCommandResult,
            "Run `argv` in the workspace's checkout (with its env and ports), wait up to "
            "`timeout_s` for it to end (then stop it), and return its exit and the end of its "
            "output, at most `max_bytes` bytes.",
            destructive=True,
        ),
        _method(
            "start_process",
            "Start a supervised process",
            "process.spawn",
            "It keeps running after this call (`foreground` binds it to this server's "
            "connection for the call only: leave it false); stop_process ends it.",
        ),
        _method(
            "stop_process",
            "Stop a supervised process",
            "process.stop",
            destructive=True,
            idempotent=True,
        ),
        _method("list_processes", "List supervised processes", "process.list", **READ),
        _method("disk_usage", "Disk usage", "workspace.usage", timeout_s=600.0, **READ),
        _method("gc_plan", "Garbage collection plan", "gc.plan", **READ),
        _method("cleanup_status", "Cleanup status", "cleanup.list", **READ),
        _method(
            "cleanup_retry",
            "Retry pending cleanup",
            "cleanup.retry",
            "It completes only deletions already decided (their work is saved).",
            idempotent=True,
            timeout_s=LONG_S,
        ),
        Tool(
            "current_workspace",
            "The workspace this runs in",
            None,
            EmptyParams,
            CurrentWorkspaceResult,
            "The workspace XUM_WORKSPACE_ID names, else the one whose checkout holds this "
            "server's current directory: its ports, env and processes.",
            **READ,
        ),
    )
}


# -- results ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a tool call answers: `structured` (the tool's result, or `{"error": ...}`), and
    the same for a reader of text, with what the contract says in plain lines first and the
    JSON last.

    An error's object goes in the text only, never as structured content: a client checks
    structured content against the tool's output schema, error or not (the TypeScript SDK
    does), and the output schema is the result's."""

    structured: dict[str, Any]
    text: str
    is_error: bool = False


def _cleanup_line(cleanup: dict[str, Any]) -> str:
    line = f"cleanup: {cleanup.get('status')}"
    if cleanup.get("status") == "pending":
        line += f" (attempt {cleanup.get('attempts', 0)}, next at {cleanup.get('next_attempt_at')}"
        line += "; cleanup_retry runs it now)"
    why = cleanup.get("last_error") or cleanup.get("reason")
    if why:
        line += f": {why}"
    reclaim = cleanup.get("reclaim")
    if reclaim:
        line += f"; reclaim: {reclaim.get('status')}"
    return line


def summary(result: dict[str, Any]) -> list[str]:
    """The contract's fields of an answer, one line each: a workspace's state and whether it is
    interrupted, the snapshot, what was dropped or kept, the physical cleanup."""
    lines: list[str] = []
    workspace = result.get("workspace")
    if isinstance(workspace, dict):
        line = f"workspace {workspace.get('id')} {workspace.get('name')}: {workspace.get('state')}"
        if workspace.get("interrupted"):
            line += f", interrupted ({workspace.get('interrupted_reason') or 'no reason'})"
        lines.append(line)
    snapshot = result.get("snapshot")
    if isinstance(snapshot, dict):
        files = snapshot.get("files") or []
        lines.append(f"snapshot: {snapshot.get('ref')} ({len(files)} file(s) saved)")
    dropped = result.get("dropped")
    if isinstance(dropped, dict) and (dropped.get("count") or dropped.get("preserved")):
        lines.append(
            f"dropped: {dropped.get('count', 0)} ignored file(s), {dropped.get('bytes', 0)} "
            f"bytes; preserved: {len(dropped.get('preserved') or [])}"
        )
    kept = result.get("kept")
    if isinstance(kept, dict):
        lines.append(f"kept: {len(kept.get('files') or [])} file(s) at {kept.get('path')}")
    cleanup = result.get("cleanup")
    if isinstance(cleanup, dict):
        lines.append(_cleanup_line(cleanup))
    return lines


def to_json(value: Any) -> str:
    return json.dumps(value, default=str)


def success(result: dict[str, Any]) -> Outcome:
    lines = summary(result)
    lines.append(to_json(result))
    return Outcome(result, "\n".join(lines))


def ran(result: RunCommandResult) -> Outcome:
    """run_command's answer: how it ended and how much of its output is shown, then the JSON."""
    if result.timed_out:
        ended = "timed out: stopped"
    elif result.exit is not None and result.exit.signal:
        ended = f"killed by {result.exit.signal}"
    else:
        ended = f"exit {result.exit.code if result.exit is not None else '?'}"
    shown = result.output_bytes - result.output_omitted
    structured = result.model_dump(mode="json")
    text = (
        f"{result.process.id} {ended}; output: {result.output_bytes} bytes, the last {shown} "
        f"shown\n{to_json(structured)}"
    )
    return Outcome(structured, text)


def _free(holder: dict[str, Any]) -> str:
    """How to free the checkout of one `busy` holder."""
    if holder.get("process_id"):
        return f"stop_process {{process_id: {holder['process_id']}}} (the daemon's own process)"
    if holder.get("kind") == "mount":
        return f"unmount it ({holder.get('label')})"
    if holder.get("kind") in ("operation", "setup", "teardown", "probe", "pending_stop"):
        return "wait for it to finish, then try again"
    pid = holder.get("pid")
    what = f"pid {pid}" if pid is not None else "it"
    return f"end {what} ({holder.get('label') or holder.get('kind')}) or release its lease"


def _error(kind: str, message: str, code: int | None = None, **data: Any) -> Outcome:
    error: dict[str, Any] = {"kind": kind, "code": code, "message": message, "data": data}
    lines = [f"{kind}: {message}"]
    holders = data.get("holders")
    if kind == "busy" and isinstance(holders, list):
        pairs = [(h, _free(h)) for h in holders if isinstance(h, dict)]
        error["free"] = [free for _, free in pairs]
        lines.extend(f"  holder: {h}\n    to free it: {free}" for h, free in pairs)
    lines.append(to_json({"error": error}))
    return Outcome({"error": error}, "\n".join(lines), is_error=True)


def _with_problems(message: str, errors: Any) -> str:
    """`invalid_params`' message with what is wrong in it (the daemon gives the count in its
    message and each problem in `data.errors`): an agent reads the message."""
    if not isinstance(errors, list) or not errors:
        return message
    said = [
        f"{'.'.join(str(p) for p in e.get('loc') or []) or '(arguments)'}: {e.get('msg')}"
        for e in errors
        if isinstance(e, dict)
    ]
    return f"{message}: " + "; ".join(said)


def failure(exc: BaseException) -> Outcome:
    """A tool error for what the daemon, the connection or the arguments said: the protocol's
    error kind, its message and data, never a stack trace."""
    if isinstance(exc, XumRpcError):
        data = {k: v for k, v in exc.data.items() if k != "kind"}
        return _error(exc.kind, _with_problems(exc.message, data.get("errors")), exc.code, **data)
    if isinstance(exc, ValidationError):
        errors = [
            {"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False, include_input=False)[:20]
        ]
        message = _with_problems(f"invalid arguments: {len(errors)} problem(s)", errors)
        return _error("invalid_params", message, -32602, errors=errors)
    if isinstance(exc, DaemonNotRunning):
        return _error("no_daemon", str(exc), root=exc.root, socket=exc.socket_path)
    if isinstance(exc, ConnectionLost):
        return _error("connection_lost", str(exc), method=exc.method, sent=exc.sent)
    if isinstance(exc, HostError):
        return _error(exc.kind, str(exc), host=exc.host, detail=exc.detail)
    if isinstance(exc, ClientTimeout | VersionMismatch):
        return _error(exc.kind, str(exc))
    return _error(str(getattr(exc, "kind", None) or "internal"), str(exc) or type(exc).__name__)


def unknown_tool(name: str) -> Outcome:
    return _error(
        "method_not_found",
        f"no tool named {name!r}; the tools are: {', '.join(sorted(TOOLS))}",
        -32601,
    )


def arguments(tool: Tool, given: dict[str, Any] | None) -> dict[str, Any]:
    """The arguments to send: as given for a daemon method (the daemon checks them), checked
    against the tool's model for a composed tool (raises ValidationError)."""
    args = dict(given or {})
    if tool.method is None:
        return tool.params.model_validate(args).model_dump(mode="json", exclude_none=True)
    return args
