"""The daemon configuration's schema as pydantic models: the documentation's source (field
descriptions, JSON Schema). The daemon validates ROOT/config.toml with `xumd.config`, which
imports no pydantic on its way to readiness; tests/test_config_lean.py checks that the two
agree on every default and on what they refuse.

Every duration is in seconds (floats), so tests can use milliseconds.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator
from xum_protocol.framing import DEFAULT_MAX_FRAME


class CleanupConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backoff_initial_s: float = Field(default=1.0, gt=0)
    backoff_max_s: float = Field(default=300.0, gt=0)
    backoff_jitter: float = Field(default=0.2, ge=0, le=1)
    batch_size: int = Field(default=16, ge=1)
    poll_interval_s: float = Field(default=30.0, gt=0)
    step_timeout_s: float = Field(default=600.0, gt=0)


class ProcessesConfig(BaseModel):
    """The process supervisor (issue 6)."""

    model_config = ConfigDict(extra="forbid")

    keep_processes: bool = Field(
        default=False,
        description="Start agents and MCP servers (without a PTY) on durable I/O under "
        "ROOT/processes and leave them running at shutdown; the next start adopts them.",
    )
    probe_interval_s: float = Field(default=2.0, gt=0)
    probe_deadline_s: float = Field(
        default=5.0,
        gt=0,
        description="The quiescence check's cwd/open-file scan; unfinished by then: busy.",
    )
    cgroup: str = Field(
        default="auto",
        min_length=1,
        description="Run every script and process in its own cgroup v2 under: `auto` (the "
        "daemon's own cgroup when it is delegated, e.g. systemd Delegate=yes), `off`, or the "
        "absolute path of a writable cgroup v2 directory (docs/PROCESSES.md, Containment).",
    )
    output_poll_s: float = Field(default=0.1, gt=0, le=5, description="Durable output polling.")
    output_head_bytes: int = Field(default=32 * 1024, ge=0)
    output_tail_bytes: int = Field(default=224 * 1024, ge=1024)
    auto_archive_attempts: int = Field(default=6, ge=1)
    auto_archive_backoff_initial_s: float = Field(default=1.0, gt=0)
    auto_archive_backoff_max_s: float = Field(default=60.0, gt=0)


class GcConfig(BaseModel):
    """Garbage collection policies (issue 14): every one is off (0 / false) by default."""

    model_config = ConfigDict(extra="forbid")

    archived_after_days: float = Field(
        default=0,
        ge=0,
        description="Remove archived workspaces archived (last changed) longer ago; 0: off.",
    )
    snapshot_refs_days: float = Field(
        default=0,
        ge=0,
        description="Delete a removed workspace's snapshot refs this long after its removal; "
        "0: off (kept forever).",
    )
    archive_merged: bool = Field(
        default=False,
        description="Archive active workspaces that are clean and whose branch (with commits of "
        "its own) is merged into the main checkout's HEAD.",
    )
    kept_after_days: float = Field(
        default=0, ge=0, description="Delete kept copies of removed workspaces after; 0: off."
    )


class UsageConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    deadline_s: float = Field(default=30.0, gt=0, description="One usage walk, then partial.")
    cache_s: float = Field(default=300.0, ge=0, description="A usage answer is reused this long.")


MAX_PORTS = 64
"""Ports one workspace may get (root `[ports] count`, a project's `[ports] count`)."""


class PortsConfig(BaseModel):
    """Ports per workspace (issue 14): a project's `[ports] count` overrides `count`."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(default=0, ge=0, le=MAX_PORTS, description="Ports per workspace by default.")
    range_start: int = Field(default=20000, ge=1024, le=65535)
    range_end: int = Field(default=29999, ge=1024, le=65535)

    @model_validator(mode="after")
    def _ordered(self) -> PortsConfig:
        if self.range_end < self.range_start:
            raise ValueError("[ports] range_end must not be below range_start")
        return self


class CreateConfig(BaseModel):
    """Copying ignored files of the main checkout into a new one (issue 14)."""

    model_config = ConfigDict(extra="forbid")

    copy_max_bytes: int = Field(
        default=8 << 30,
        ge=0,
        description="Allocated bytes copied at most; entries beyond are skipped and reported.",
    )
    copy_timeout_s: float = Field(default=600.0, gt=0)


class DaemonConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_frame_bytes: int = Field(default=DEFAULT_MAX_FRAME, ge=1024)
    max_inflight_per_connection: int = Field(default=64, ge=1)
    max_batch_items: int = Field(default=1000, ge=1)
    write_queue_messages: int = Field(default=1024, ge=1)
    write_queue_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    max_connections: int = Field(
        default=4096,
        ge=1,
        description="Client connections served at once; further clients get one `busy` error. "
        "Also kept below the descriptor limit minus `fd_reserve`.",
    )
    fd_reserve: int = Field(
        default=256,
        ge=16,
        description="File descriptors kept for the daemon's own work (git, scripts, the store, "
        "PTYs): connections are capped at the soft limit minus this (at most half the limit).",
    )
    event_ring_size: int = Field(
        default=4096,
        ge=0,
        le=1_000_000,
        description="Events kept for a reconnecting subscriber to resume from "
        "(`events.subscribe` `after_seq`); 0: every resume is a resync.",
    )
    event_ring_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=0,
        description="...and at most this many bytes of them (their JSON): the oldest go first.",
    )
    shutdown_grace_s: float = Field(default=10.0, gt=0)
    drain_deadline_s: float = Field(default=10.0, gt=0)
    lock_wait_s: float = Field(default=30.0, gt=0)
    git_timeout_s: float = Field(default=120.0, gt=0)
    script_timeout_s: float = Field(default=600.0, gt=0)
    fetch_timeout_s: float = Field(
        default=60.0, gt=0, description="`workspace.create {fetch}`: the base's git fetch."
    )
    stop_grace_s: float = Field(default=5.0, ge=0)
    enable_test_methods: bool = False
    cleanup: CleanupConfig = Field(default_factory=CleanupConfig)
    processes: ProcessesConfig = Field(default_factory=ProcessesConfig)
    gc: GcConfig = Field(default_factory=GcConfig)
    usage: UsageConfig = Field(default_factory=UsageConfig)
    ports: PortsConfig = Field(default_factory=PortsConfig)
    create: CreateConfig = Field(default_factory=CreateConfig)
