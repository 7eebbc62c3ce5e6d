"""Daemon configuration: defaults, overridden by ROOT/config.toml, then by the command line.

Every duration is in seconds (floats), so tests can use milliseconds.

Validated here without pydantic: building pydantic models costs its import and their build on
every start's way to readiness (~50 ms of CPU before READY=1 with a config file:
docs/PERFORMANCE.md, "Copies kept for speed", measured by `bench.copies`). Each section is a
table of keys (type, default, bounds); values are taken as pydantic's lax mode takes them (an
integral float for an int, a numeric string, `yes`/`no` for a bool), and a refusal reads as
pydantic's did. `xumd.base.config_schema` derives pydantic models from these tables, for the
documentation; tests/daemon/test_config_lean.py checks that pydantic, given the same keys, takes and
refuses what this module does.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from xum_protocol.framing import DEFAULT_MAX_FRAME

MAX_PORTS = 64
"""Ports one workspace may get (root `[ports] count`, a project's `[ports] count`)."""

_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


class Key(NamedTuple):
    """One setting: its type, its default, its bounds (None: unbounded) and what it does (the
    documentation's description, `xumd.base.config_schema`)."""

    kind: type[Any]
    default: Any
    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    min_length: int | None = None
    doc: str | None = None


class Problem(NamedTuple):
    """One refused value, as pydantic words it: where, what, which type of error."""

    loc: tuple[str, ...]
    msg: str
    type: str
    value: Any


class ConfigError(Exception):
    pass


class Invalid(ValueError):
    """The problems of one validation (at most a few: each key's first)."""

    def __init__(self, title: str, problems: list[Problem]) -> None:
        self.title = title
        self.problems = problems
        count = len(problems)
        lines = [f"{count} validation error{'s' if count != 1 else ''} for {title}"]
        for problem in problems:
            lines.append(".".join(problem.loc) if problem.loc else title)
            lines.append(
                f"  {problem.msg} [type={problem.type}, input_value={problem.value!r}, "
                f"input_type={type(problem.value).__name__}]"
            )
        super().__init__("\n".join(lines))


def _number(kind: type[Any], value: Any) -> tuple[Any, Problem | None]:
    """`value` as an int or float the way pydantic's lax mode reads it, or the problem."""
    name = "integer" if kind is int else "number"
    if isinstance(value, str):
        try:
            parsed: Any = int(value.strip()) if kind is int else float(value.strip())
        except ValueError:
            how = "an integer" if kind is int else "a number"
            return None, Problem(
                (),
                f"Input should be a valid {name}, unable to parse string as {how}",
                f"{kind.__name__}_parsing",
                value,
            )
        return parsed, None
    if isinstance(value, bool | int):
        return kind(value), None
    if isinstance(value, float):
        if kind is float:
            return value, None
        if math.isfinite(value) and value.is_integer():
            return int(value), None
        if math.isfinite(value):
            return None, Problem(
                (),
                "Input should be a valid integer, got a number with a fractional part",
                "int_from_float",
                value,
            )
    return None, Problem((), f"Input should be a valid {name}", f"{kind.__name__}_type", value)


def _bool(value: Any) -> tuple[Any, Problem | None]:
    if isinstance(value, bool):
        return value, None
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value), None
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE, None
    kind = "bool_parsing" if isinstance(value, str | int | float) else "bool_type"
    message = "Input should be a valid boolean"
    if kind == "bool_parsing":
        message += ", unable to interpret input"
    return None, Problem((), message, kind, value)


def _strings(value: Any) -> tuple[Any, Problem | None]:
    """A list of strings (a key of kind `list`), as pydantic reads `list[str]`."""
    if not isinstance(value, list | tuple):
        return None, Problem((), "Input should be a valid list", "list_type", value)
    for index, item in enumerate(value):
        if not isinstance(item, str):
            return None, Problem(
                (str(index),), "Input should be a valid string", "string_type", item
            )
    return list(value), None


def _check(key: Key, value: Any) -> tuple[Any, Problem | None]:
    """`value` checked against `key` (sections excepted), or the problem."""
    if key.kind is bool:
        return _bool(value)
    if key.kind is list:
        return _strings(value)
    if key.kind is str:
        if not isinstance(value, str):
            return None, Problem((), "Input should be a valid string", "string_type", value)
        if key.min_length is not None and len(value) < key.min_length:
            return None, Problem(
                (),
                f"String should have at least {key.min_length} character"
                f"{'s' if key.min_length != 1 else ''}",
                "string_too_short",
                value,
            )
        return value, None
    number, problem = _number(key.kind, value)
    if problem is not None:
        return None, problem
    for bound, outside, words, kind in (
        (key.gt, key.gt is not None and not number > key.gt, "greater than", "greater_than"),
        (
            key.ge,
            key.ge is not None and not number >= key.ge,
            "greater than or equal to",
            "greater_than_equal",
        ),
        (
            key.le,
            key.le is not None and not number <= key.le,
            "less than or equal to",
            "less_than_equal",
        ),
    ):
        if outside:
            shown = int(bound) if key.kind is int and bound is not None else bound
            return None, Problem((), f"Input should be {words} {shown}", kind, value)
    return number, None


class Section:
    """A table of settings: `KEYS` says each one's type, default and bounds. Built from keyword
    values (a TOML table's), each checked; unknown keys are refused."""

    __slots__ = ()
    KEYS: ClassVar[dict[str, Key]] = {}

    def __init__(self, **values: Any) -> None:
        problems = self._fill(values)
        if problems:
            raise Invalid(type(self).__name__, problems)

    def _fill(self, values: dict[str, Any]) -> list[Problem]:
        problems: list[Problem] = []
        for name, key in self.KEYS.items():
            if name not in values:
                default = key.default() if callable(key.default) else key.default
                object.__setattr__(self, name, default)
                continue
            value = values[name]
            if isinstance(key.kind, type) and issubclass(key.kind, Section):
                if isinstance(value, key.kind):
                    object.__setattr__(self, name, value)
                    continue
                if not isinstance(value, dict):
                    problems.append(
                        Problem(
                            (name,),
                            "Input should be a valid dictionary or instance of "
                            f"{key.kind.__name__}",
                            "model_type",
                            value,
                        )
                    )
                    continue
                section = key.kind.__new__(key.kind)
                inner = section._fill(value)
                problems += [p._replace(loc=(name, *p.loc)) for p in inner]
                if not inner:
                    object.__setattr__(self, name, section)
                continue
            checked, problem = _check(key, value)
            if problem is not None:
                problems.append(problem._replace(loc=(name, *problem.loc)))
            else:
                object.__setattr__(self, name, checked)
        problems += [
            Problem((name,), "Extra inputs are not permitted", "extra_forbidden", values[name])
            for name in values
            if name not in self.KEYS
        ]
        if not problems:
            why = self._consistent()
            if why is not None:
                problems.append(Problem((), f"Value error, {why}", "value_error", values))
        return problems

    def _consistent(self) -> str | None:
        """Why the values, each valid, do not fit together; None when they do."""
        return None

    def model_dump(self) -> dict[str, Any]:
        """Every setting as a plain value (sections as tables), as the schema's models dump."""
        out: dict[str, Any] = {}
        for name in self.KEYS:
            value = getattr(self, name)
            out[name] = value.model_dump() if isinstance(value, Section) else value
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model_dump()!r})"


class CleanupConfig(Section):
    __slots__ = (
        "backoff_initial_s",
        "backoff_jitter",
        "backoff_max_s",
        "batch_size",
        "poll_interval_s",
        "step_timeout_s",
    )
    KEYS = {
        "backoff_initial_s": Key(float, 1.0, gt=0),
        "backoff_max_s": Key(float, 300.0, gt=0),
        "backoff_jitter": Key(float, 0.2, ge=0, le=1),
        "batch_size": Key(int, 16, ge=1),
        "poll_interval_s": Key(float, 30.0, gt=0),
        "step_timeout_s": Key(float, 600.0, gt=0),
    }
    backoff_initial_s: float
    backoff_max_s: float
    backoff_jitter: float
    batch_size: int
    poll_interval_s: float
    step_timeout_s: float


class ProcessesConfig(Section):
    """The process supervisor."""

    __slots__ = (
        "auto_archive_attempts",
        "auto_archive_backoff_initial_s",
        "auto_archive_backoff_max_s",
        "cgroup",
        "keep_processes",
        "output_head_bytes",
        "output_poll_s",
        "output_tail_bytes",
        "probe_deadline_s",
        "probe_interval_s",
    )
    KEYS = {
        "keep_processes": Key(
            bool,
            False,
            doc=(
                "Start agents and MCP servers (without a PTY) on durable I/O under ROOT/processes"
                " and leave them running at shutdown; the next start adopts them."
            ),
        ),
        "probe_interval_s": Key(float, 2.0, gt=0),
        "probe_deadline_s": Key(
            float,
            5.0,
            gt=0,
            doc="The quiescence check's cwd/open-file scan; unfinished by then: busy.",
        ),
        "cgroup": Key(
            str,
            "auto",
            min_length=1,
            doc=(
                "Run every script and process in its own cgroup v2 under: `auto` (the daemon's "
                "own cgroup when it is delegated, e.g. systemd Delegate=yes), `off`, or the "
                "absolute path of a writable cgroup v2 directory (docs/PROCESSES.md, "
                "Containment)."
            ),
        ),
        "output_poll_s": Key(
            float,
            0.1,
            gt=0,
            le=5,
            doc="Durable output polling.",
        ),
        "output_head_bytes": Key(int, 32 * 1024, ge=0),
        "output_tail_bytes": Key(int, 224 * 1024, ge=1024),
        "auto_archive_attempts": Key(int, 6, ge=1),
        "auto_archive_backoff_initial_s": Key(float, 1.0, gt=0),
        "auto_archive_backoff_max_s": Key(float, 60.0, gt=0),
    }
    keep_processes: bool
    probe_interval_s: float
    probe_deadline_s: float
    cgroup: str
    output_poll_s: float
    output_head_bytes: int
    output_tail_bytes: int
    auto_archive_attempts: int
    auto_archive_backoff_initial_s: float
    auto_archive_backoff_max_s: float

    def __setattr__(self, name: str, value: Any) -> None:
        # `--keep-processes` sets it after loading: the one setting changed in place.
        checked, problem = _check(self.KEYS[name], value)
        if problem is not None:
            raise Invalid(type(self).__name__, [problem._replace(loc=(name,))])
        object.__setattr__(self, name, checked)


class GcConfig(Section):
    """Garbage collection policies and the disk budget: every one is off (0 / false / empty) by
    default."""

    __slots__ = (
        "archive_idle_days",
        "archive_merged",
        "archived_after_days",
        "budget_interval_s",
        "idle_after_s",
        "kept_after_days",
        "max_bytes",
        "max_workspaces",
        "min_free_bytes",
        "min_free_percent",
        "rebuildable",
        "snapshot_refs_days",
    )
    KEYS = {
        "archived_after_days": Key(
            float,
            0,
            ge=0,
            doc="Remove archived workspaces archived (last changed) longer ago; 0: off.",
        ),
        "snapshot_refs_days": Key(
            float,
            0,
            ge=0,
            doc=(
                "Delete a removed workspace's snapshot refs this long after its removal; 0: off "
                "(kept forever)."
            ),
        ),
        "archive_merged": Key(
            bool,
            False,
            doc=(
                "Archive active workspaces that are clean and whose branch (with commits of its "
                "own) is merged into the main checkout's HEAD."
            ),
        ),
        "kept_after_days": Key(
            float,
            0,
            ge=0,
            doc="Delete kept copies of removed workspaces after; 0: off.",
        ),
        "min_free_bytes": Key(
            int,
            0,
            ge=0,
            doc=(
                "Disk budget: free bytes to keep on each filesystem the root's workspaces (and"
                " the root) live on; 0: off."
            ),
        ),
        "min_free_percent": Key(
            float,
            0,
            ge=0,
            le=100,
            doc="Disk budget: free space to keep on each such filesystem, in percent; 0: off.",
        ),
        "max_bytes": Key(
            int,
            0,
            ge=0,
            doc=(
                "Disk budget: allocated bytes of the root's checkouts, trash and archive store"
                " together; 0: off."
            ),
        ),
        "rebuildable": Key(
            list,
            list,
            doc=(
                "Ignored directories that can be deleted from an idle workspace without losing"
                " work (gitignore patterns, matched as `[create] copy`: `node_modules/`,"
                " `target/`); a project's `.xum/config.toml` `[gc] rebuildable` adds its own."
                " Evicted (moved to the trash) only while a budget is exceeded."
            ),
        ),
        "idle_after_s": Key(
            float,
            3600.0,
            ge=0,
            doc=(
                "A workspace is idle (its rebuildable directories may be evicted) when nothing"
                " held it and nothing in its checkout outside them changed for this long."
            ),
        ),
        "budget_interval_s": Key(
            float,
            300.0,
            gt=0,
            doc="How often the daemon checks the disk budget (also after each create).",
        ),
        "max_workspaces": Key(
            int,
            0,
            ge=0,
            doc=(
                "Disk budget: a project's workspaces that hold a checkout (active, and archived"
                " ones whose checkout is still on disk), at most; 0: off."
            ),
        ),
        "archive_idle_days": Key(
            float,
            0,
            ge=0,
            doc=(
                "While a budget is exceeded and evictions do not restore it: archive active"
                " workspaces that are clean and were not used for this long (snapshot first);"
                " 0: off."
            ),
        ),
    }
    archived_after_days: float
    snapshot_refs_days: float
    archive_merged: bool
    kept_after_days: float
    min_free_bytes: int
    min_free_percent: float
    max_bytes: int
    rebuildable: list[str]
    idle_after_s: float
    budget_interval_s: float
    max_workspaces: int
    archive_idle_days: float

    def budgeted(self) -> bool:
        """Whether any disk budget is set."""
        return bool(
            self.min_free_bytes or self.min_free_percent or self.max_bytes or self.max_workspaces
        )


class UsageConfig(Section):
    __slots__ = ("cache_s", "deadline_s")
    KEYS = {
        "deadline_s": Key(
            float,
            30.0,
            gt=0,
            doc="One usage walk, then partial.",
        ),
        "cache_s": Key(
            float,
            300.0,
            ge=0,
            doc="A usage answer is reused this long.",
        ),
    }
    deadline_s: float
    cache_s: float


class PortsConfig(Section):
    """Ports per workspace: a project's `[ports] count` overrides `count`."""

    __slots__ = ("count", "range_end", "range_start")
    KEYS = {
        "count": Key(
            int,
            0,
            ge=0,
            le=MAX_PORTS,
            doc="Ports per workspace by default.",
        ),
        "range_start": Key(int, 20000, ge=1024, le=65535),
        "range_end": Key(int, 29999, ge=1024, le=65535),
    }
    count: int
    range_start: int
    range_end: int

    def _consistent(self) -> str | None:
        if self.range_end < self.range_start:
            return "[ports] range_end must not be below range_start"
        return None


class CreateConfig(Section):
    """Copying ignored files of the main checkout into a new one; the warm pool's size."""

    __slots__ = ("copy_max_bytes", "copy_timeout_s", "pool")
    KEYS = {
        "copy_max_bytes": Key(
            int,
            8 << 30,
            ge=0,
            doc="Allocated bytes copied at most; entries beyond are skipped and reported.",
        ),
        "copy_timeout_s": Key(float, 600.0, gt=0),
        "pool": Key(
            int,
            0,
            ge=0,
            le=16,
            doc=(
                "Warm checkouts kept ready at each git project's base (a project's"
                " `[create] pool` overrides it); 0: no pool."
            ),
        ),
    }
    copy_max_bytes: int
    copy_timeout_s: float
    pool: int


class DaemonConfig(Section):
    __slots__ = (
        "cleanup",
        "create",
        "drain_deadline_s",
        "enable_test_methods",
        "event_ring_bytes",
        "event_ring_size",
        "fd_reserve",
        "fetch_timeout_s",
        "gc",
        "git_timeout_s",
        "lock_wait_s",
        "max_batch_items",
        "max_connections",
        "max_frame_bytes",
        "max_inflight_per_connection",
        "ports",
        "processes",
        "script_timeout_s",
        "shutdown_grace_s",
        "stop_grace_s",
        "usage",
        "write_queue_bytes",
        "write_queue_messages",
    )
    KEYS = {
        "max_frame_bytes": Key(int, DEFAULT_MAX_FRAME, ge=1024),
        "max_inflight_per_connection": Key(int, 64, ge=1),
        "max_batch_items": Key(int, 1000, ge=1),
        "write_queue_messages": Key(int, 1024, ge=1),
        "write_queue_bytes": Key(int, 32 * 1024 * 1024, ge=1024),
        "max_connections": Key(
            int,
            4096,
            ge=1,
            doc=(
                "Client connections served at once; further clients get one `busy` error. Also "
                "kept below the descriptor limit minus `fd_reserve`."
            ),
        ),
        "fd_reserve": Key(
            int,
            256,
            ge=16,
            doc=(
                "File descriptors kept for the daemon's own work (git, scripts, the store, PTYs):"
                " connections are capped at the soft limit minus this (at most half the limit)."
            ),
        ),
        "event_ring_size": Key(
            int,
            4096,
            ge=0,
            le=1_000_000,
            doc=(
                "Events kept for a reconnecting subscriber to resume from (`events.subscribe` "
                "`after_seq`); 0: every resume is a resync."
            ),
        ),
        "event_ring_bytes": Key(
            int,
            32 * 1024 * 1024,
            ge=0,
            doc="...and at most this many bytes of them (their JSON): the oldest go first.",
        ),
        "shutdown_grace_s": Key(float, 10.0, gt=0),
        "drain_deadline_s": Key(float, 10.0, gt=0),
        "lock_wait_s": Key(float, 30.0, gt=0),
        "git_timeout_s": Key(float, 120.0, gt=0),
        "script_timeout_s": Key(float, 600.0, gt=0),
        "fetch_timeout_s": Key(
            float,
            60.0,
            gt=0,
            doc="`workspace.create {fetch}`: the base's git fetch.",
        ),
        "stop_grace_s": Key(float, 5.0, ge=0),
        "enable_test_methods": Key(bool, False),
        "cleanup": Key(CleanupConfig, CleanupConfig),
        "processes": Key(ProcessesConfig, ProcessesConfig),
        "gc": Key(GcConfig, GcConfig),
        "usage": Key(UsageConfig, UsageConfig),
        "ports": Key(PortsConfig, PortsConfig),
        "create": Key(CreateConfig, CreateConfig),
    }
    max_frame_bytes: int
    max_inflight_per_connection: int
    max_batch_items: int
    write_queue_messages: int
    write_queue_bytes: int
    max_connections: int
    fd_reserve: int
    event_ring_size: int
    event_ring_bytes: int
    shutdown_grace_s: float
    drain_deadline_s: float
    lock_wait_s: float
    git_timeout_s: float
    script_timeout_s: float
    fetch_timeout_s: float
    stop_grace_s: float
    enable_test_methods: bool
    cleanup: CleanupConfig
    processes: ProcessesConfig
    gc: GcConfig
    usage: UsageConfig
    ports: PortsConfig
    create: CreateConfig


def load(path: Path, overrides: dict[str, Any] | None = None) -> DaemonConfig:
    data: dict[str, Any] = {}
    if path.exists():
        import tomllib  # only for a root that has the file (its import: ~2 ms before READY=1)

        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
    data.update(overrides or {})
    try:
        return DaemonConfig(**data)
    except Invalid as exc:
        raise ConfigError(f"invalid configuration in {path}: {exc}") from exc
