"""hello, daemon.status, daemon.shutdown."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from xum_protocol.methods_base import MethodSpec
from xum_protocol.models.base import Params, Result


class ClientInfo(Params):
    name: str = Field(min_length=1, max_length=200)
    version: str = Field(default="", max_length=200)


class HelloParams(Params):
    protocol: str = Field(max_length=32, description="The client's protocol version, e.g. '1.0'.")
    client: ClientInfo | None = None


class ServerInfo(Result):
    name: str
    version: str


class HelloResult(Result):
    protocol: str = Field(description="The protocol version the server speaks (major.minor).")
    server: ServerInfo = Field(description="The daemon's name and version.")
    root: str = Field(description="The daemon's root directory.")
    capabilities: list[str] = Field(description="Every method this server answers.")
    pid: int | None = Field(
        default=None, description="The daemon's process id. Since 1.1 (absent before)."
    )
    started_at: float | None = Field(
        default=None,
        description="When the daemon started (Unix time, seconds). Since 1.1 (absent before).",
    )
    epoch: str | None = Field(
        default=None,
        description="This daemon run's event epoch (as in events): another epoch than a "
        "client saw before means the daemon restarted. Since 1.1 (absent before).",
    )
    socket: str | None = Field(
        default=None,
        description="The socket path the daemon listens on. Since 1.1 (absent before).",
    )


class EmptyParams(Params):
    pass


class ContainmentStatus(Result):
    """`daemon.status` details['containment']: how the daemon finds every process it started
    and every descendant again (docs/PROCESSES.md, "Containment")."""

    mechanism: Literal["cgroup+subreaper+marker", "subreaper+marker", "cgroup+marker", "marker"]
    subreaper: bool = Field(description="The daemon is the child subreaper of its descendants.")
    cgroup: str | None = Field(
        default=None, description="The cgroup v2 directory each run gets its own cgroup under."
    )
    marker: str = Field(description="The environment variable every child carries.")
    instance: str = Field(description="This daemon run's part of the marker.")
    stopped_at_start: int = Field(
        description="Processes a previous daemon instance left running, stopped at start-up."
    )
    escaped: list[dict[str, object]] = Field(
        default_factory=list,
        description="Processes of a run that survived SIGKILL (newest 64): pid, marker, argv.",
    )
    cgroup_setting: str = Field(
        default="auto",
        description="`[processes] cgroup` as configured: `auto`, `off` or a path (since 1.3).",
    )
    degraded: str | None = Field(
        default=None,
        description="Why containment is weaker than configured, null when it is not: a "
        "configured cgroup that cannot be used, or runs that could not get their own cgroup. "
        "Every process is still stopped with its session or group and found again by its "
        "marker (and the subreaper); a descendant that clears its environment and leaves the "
        "tree is then only reaped, not stopped (since 1.3).",
    )
    runs_without_cgroup: int = Field(
        default=0,
        description="Runs that started without their own cgroup although runs get one (its "
        "creation failed; the run went ahead with its marker) (since 1.3).",
    )


class PlatformStatus(Result):
    """`daemon.status` details['platform']: which backend asks the operating system, and what
    it cannot guarantee (docs/RELIABILITY.md, "Platforms") (since 1.4)."""

    backend: Literal["linux", "portable"] = Field(
        description="`linux` (/proc, subreaper, pidfds, mount ids, cgroups) or `portable` "
        "(psutil and POSIX calls: macOS, the BSDs; on Linux with XUM_PLATFORM=portable)."
    )
    weaker: list[str] = Field(
        default_factory=list,
        description="Each guarantee this backend keeps only in a weaker form, in words; empty "
        "on Linux.",
    )


class GcStatus(Result):
    """`daemon.status` details['gc']: the disk budget (`[gc] min_free_*`, `max_bytes`,
    `max_workspaces`) in one line (since 1.4, additive)."""

    budget: str = Field(
        description="off (no budget set); not checked yet; holds: how far from it each "
        "filesystem is; exceeded, being restored: what each lacks; cannot be met: what each "
        "lacks while what is left is busy, unsaved or not rebuildable (reported once per "
        "episode as the `gc.budget_exceeded` event). Any of these may end with `; the warm "
        "pool's refill is held back for <project ids>`: entries the budget has no room for."
    )


class DaemonStatusResult(Result):
    pid: int
    root: str
    version: str
    protocol: str
    started_at: float
    uptime_s: float
    connections: int
    shutting_down: bool = False
    details: dict[str, object] = Field(default_factory=dict)


class ShutdownResult(Result):
    stopping: bool


HELLO = MethodSpec("hello", HelloParams, HelloResult, "Handshake: negotiate the protocol version.")
DAEMON_STATUS = MethodSpec(
    "daemon.status",
    EmptyParams,
    DaemonStatusResult,
    "The daemon's pid, root, uptime; `details` per feature (e.g. `containment`: which "
    "mechanism contains the processes it starts). Every figure is as of the answer (a "
    "change a client made is in the next status it asks for), except `details.fds.open`, "
    "the count of open descriptors, sampled at most every 0.5 s.",
)
DAEMON_SHUTDOWN = MethodSpec(
    "daemon.shutdown", EmptyParams, ShutdownResult, "Begin a graceful stop."
)
