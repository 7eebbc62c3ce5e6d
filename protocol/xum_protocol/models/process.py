"""Protocol models of the `process` domain: supervised agents, terminals, MCP servers, commands."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from xum_protocol.methods_base import MethodSpec
from xum_protocol.models.base import Label, Params, Result

ProcessKind = Literal["agent", "terminal", "mcp", "exec"]
ProcessState = Literal["running", "stopping", "pending_stop", "exited"]
OutputEncoding = Literal["utf-8", "base64"]
OnDaemonStop = Literal["keep", "stop"]
StopReason = Literal["request", "session", "release", "shutdown"]
OutputSource = Literal["memory", "file", "none"]


class SpawnParams(Params):
    workspace_id: str = Field(min_length=1, max_length=64)
    kind: ProcessKind
    argv: list[str] = Field(min_length=1, max_length=4096, description="Program and arguments.")
    env: dict[str, str] | None = Field(default=None, description="Added to the daemon's env.")
    pty: bool = Field(default=False, description="Run on a pseudo-terminal (terminals).")
    cols: int | None = Field(default=None, ge=1, le=4096)
    rows: int | None = Field(default=None, ge=1, le=4096)
    label: Label | None = None
    foreground: bool = Field(
        default=False,
        description="Bind to the calling connection: stopped when it closes, unless moved to "
        "the background (`process.background`, exec only).",
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str] | None) -> dict[str, str] | None:
        # A name with '=' (or none at all) cannot be an environment entry: `NAME=value` would
        # be split elsewhere than the caller meant.
        for name in env or {}:
            if not name or "=" in name:
                raise ValueError(f"env name {name!r} is empty or contains '='")
        return env


class StoppedLeftover(Result):
    """A process a run left behind (a background job, a double fork, a `setsid`), stopped by
    the daemon when the run ended: a run does not outlive itself (docs/PROCESSES.md,
    "Containment"). To keep a process running, start it as its own supervised process."""

    pid: int
    argv: list[str] = Field(description="Its command line, as read before it was stopped.")
    signal: Literal["SIGTERM", "SIGKILL"] = Field(
        description="What ended it: SIGTERM, or SIGKILL when it outlived the grace."
    )
    ran_s: float | None = Field(
        default=None, description="How long it had run when it was stopped (null: unknown)."
    )


class ProcessExit(Result):
    code: int | None = None
    signal: str | None = None
    settled_by: Literal["exit", "probe", "unknown"] = Field(
        description="`exit`: the exit status was read; `probe`: the process was found gone "
        "(its status could not be read); `unknown`: adopted after a restart and gone."
    )
    at: float
    stop_reason: StopReason | None = Field(
        default=None,
        description="Why the daemon stopped it: `request` (process.stop), `session` (its "
        "foreground caller went away), `release` (release_all, archive {stop}), `shutdown` (the "
        "daemon stopped and did not keep it). Absent: it ended on its own.",
    )
    leftovers: list[StoppedLeftover] = Field(
        default_factory=list,
        description="What it left running when it exited (its group, descendants that left "
        "the group, its cgroup), stopped by the daemon then. Empty: it left nothing.",
    )


class ProcessInfo(Result):
    id: str
    workspace_id: str
    kind: ProcessKind
    argv: list[str]
    label: str
    pid: int | None
    pgid: int | None
    started_at: float
    state: ProcessState
    pty: bool
    foreground: bool
    adopted: bool = Field(default=False, description="Found alive at start-up through its lease.")
    lease_id: str | None = None
    exit: ProcessExit | None = None
    on_daemon_stop: OnDaemonStop = Field(
        default="stop",
        description="`keep`: left running when the daemon stops and adopted at the next start "
        "(keep_processes; agents and MCP servers without a PTY, on durable I/O); `stop`: stopped "
        "at shutdown (terminals and PTYs, commands, or keep_processes off).",
    )


class ProcessRef(Params):
    process_id: str = Field(min_length=1, max_length=64)


class ListParams(Params):
    workspace_id: str | None = None


class ListResult(Result):
    processes: list[ProcessInfo]


class OutputParams(Params):
    process_id: str = Field(min_length=1, max_length=64)
    since: int = Field(default=0, ge=0, description="Byte offset from a previous `next`.")
    wait_s: float = Field(
        default=0, ge=0, le=30, description="Wait up to this long for output or the exit."
    )
    encoding: OutputEncoding = "utf-8"
    max_bytes: int = Field(default=65536, ge=1, le=1 << 20)


class OutputResult(Result):
    data: str = Field(description="The bytes in `encoding` (utf-8 with replacement, or base64).")
    encoding: OutputEncoding
    start: int = Field(description="Offset of the first byte returned.")
    next: int = Field(description="Pass as `since` to continue.")
    dropped: int = Field(description="Bytes between `since` and `start` that were not kept.")
    dropped_total: int
    exited: bool
    exit: ProcessExit | None = None
    source: OutputSource = Field(
        default="memory",
        description="`memory`: this daemon's ring (lost at a restart); `file`: a durable file "
        "under ROOT (offsets stay valid across restarts); `none`: adopted without a durable "
        "file, its output is not captured.",
    )


class WriteParams(Params):
    # Bytes for stdin or a terminal: NUL is a valid byte there (Ctrl-@), not a name.
    nul_allowed: ClassVar[frozenset[str]] = frozenset({"data"})

    process_id: str = Field(min_length=1, max_length=64)
    data: str = Field(default="", max_length=1 << 20)
    encoding: OutputEncoding = "utf-8"
    eof: bool = Field(
        default=False,
        description="Close stdin after writing (pipes only; refused for durable stdin, which "
        "can outlive the daemon and never ends).",
    )


class WriteResult(Result):
    written: int


class ResizeParams(Params):
    process_id: str = Field(min_length=1, max_length=64)
    cols: int = Field(ge=1, le=4096)
    rows: int = Field(ge=1, le=4096)


class SignalParams(Params):
    process_id: str = Field(min_length=1, max_length=64)
    signal: str = Field(min_length=1, max_length=16, description="e.g. TERM, SIGINT, HUP")


class WaitParams(Params):
    process_id: str = Field(min_length=1, max_length=64)
    timeout_s: float = Field(default=30, ge=0, le=3600)


class StopParams(Params):
    process_id: str = Field(min_length=1, max_length=64)
    grace_s: float | None = Field(default=None, ge=0, le=600)


class ReleaseAllParams(Params):
    workspace_id: str = Field(min_length=1, max_length=64)
    deadline_s: float | None = Field(default=None, gt=0, le=600)


class ReleaseAllResult(Result):
    stopped: list[str]
    still_running: list[ProcessInfo]


class HoldersParams(Params):
    workspace_id: str = Field(min_length=1, max_length=64)


class HolderInfo(Result):
    kind: str = Field(
        description="terminal, agent, mcp, exec, editor, setup, teardown, process (found by the "
        "cwd/open-file probe), pending_stop, probe, operation, or mount: a mount point at or "
        "under the checkout (`pid` null, `label` `mount at <path>`); the checkout is never "
        "deleted, moved or renamed while one is there."
    )
    pid: int | None
    label: str
    since: float | None = None
    process_id: str | None = Field(
        default=None,
        description="The supervised process (`proc_...`) when the daemon started it: "
        "`process.stop` frees the checkout of it.",
    )
    command: str | None = Field(
        default=None, description="Its command line (shell-quoted, cut at 200 characters)."
    )


class HoldersResult(Result):
    holders: list[HolderInfo]
    message: str | None = Field(default=None, description="The `busy` message, if any holder.")


class ProcessResult(Result):
    process: ProcessInfo


PROCESS_SPAWN = MethodSpec(
    "process.spawn", SpawnParams, ProcessResult, "Start a supervised process.", mutating=True
)
PROCESS_LIST = MethodSpec("process.list", ListParams, ListResult, "Supervised processes.")
PROCESS_GET = MethodSpec("process.get", ProcessRef, ProcessResult, "One supervised process.")
PROCESS_OUTPUT = MethodSpec("process.output", OutputParams, OutputResult, "Output since an offset.")
PROCESS_WRITE = MethodSpec(
    "process.write", WriteParams, WriteResult, "Write to stdin or the PTY.", mutating=True
)
PROCESS_RESIZE = MethodSpec(
    "process.resize", ResizeParams, ProcessResult, "Resize a PTY.", mutating=True
)
PROCESS_SIGNAL = MethodSpec(
    "process.signal", SignalParams, ProcessResult, "Signal the process group.", mutating=True
)
PROCESS_WAIT = MethodSpec("process.wait", WaitParams, ProcessResult, "Wait for the exit, bounded.")
PROCESS_STOP = MethodSpec(
    "process.stop", StopParams, ProcessResult, "SIGTERM, grace, SIGKILL the tree.", mutating=True
)
PROCESS_BACKGROUND = MethodSpec(
    "process.background",
    ProcessRef,
    ProcessResult,
    "Detach a foreground exec from its caller.",
    mutating=True,
)
PROCESS_RELEASE_ALL = MethodSpec(
    "process.release_all",
    ReleaseAllParams,
    ReleaseAllResult,
    "Stop a workspace's processes, bounded; reports what still runs.",
    mutating=True,
)
PROCESS_HOLDERS = MethodSpec(
    "process.holders",
    HoldersParams,
    HoldersResult,
    "Who uses a workspace's checkout (the quiescence check).",
)

__all__ = ["ProcessInfo", "ProcessKind", "ProcessState"]
