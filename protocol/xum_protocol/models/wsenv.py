"""Protocol models of a workspace's environment, ports and seeded ignored files: the `env` of
`workspace.create`, its rule, and the copy report."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from xum_protocol.models.base import Result

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RESERVED_PREFIX = "XUM_"
MAX_ENV_VARS = 256
MAX_ENV_BYTES = 64 * 1024
"""Names and values together: it is stored with the workspace and given to every child."""

XUM_VARS = (
    "XUM_WORKSPACE_ID",
    "XUM_WORKSPACE_NAME",
    "XUM_WORKSPACE_PATH",
    "XUM_PROJECT_PATH",
    "XUM_BRANCH",
    "XUM_PORT",
    "XUM_PORTS",
    "XUM_ROOT",
)
"""What the daemon sets for setup, teardown and every process (docs/CONFIGURATION.md)."""


def env_problem(env: object, where: str = "env") -> str | None:
    """Why `env` is not a valid workspace environment (None when it is): a table of at most
    MAX_ENV_VARS string values whose names are shell identifiers, not reserved (`XUM_*` is the
    daemon's), without NUL, at most MAX_ENV_BYTES in all."""
    if not isinstance(env, dict):
        return f'{where} must be a table of NAME = "value"'
    if len(env) > MAX_ENV_VARS:
        return f"{where} has {len(env)} variables; at most {MAX_ENV_VARS}"
    total = 0
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            return (
                f"{where}: {name!r} is not a valid variable name (letters, digits and '_', "
                "not starting with a digit, at most 128 characters)"
            )
        if name.upper().startswith(RESERVED_PREFIX):
            return (
                f"{where}: {name!r} is reserved: XUM_* variables are set by the daemon "
                f"({', '.join(XUM_VARS)}) and cannot be overridden"
            )
        if not isinstance(value, str):
            return f"{where}: the value of {name} must be a string"
        if "\0" in value:
            return f"{where}: the value of {name} contains a NUL character"
        total += len(name.encode()) + len(value.encode("utf-8", "surrogatepass"))
    if total > MAX_ENV_BYTES:
        return f"{where} is {total} bytes; at most {MAX_ENV_BYTES}"
    return None


CopyStatus = Literal["none", "ok", "capped"]


class CopyReport(Result):
    """Ignored files of the main checkout copied into a new checkout (`[create] copy`,
    `.worktreeinclude`), before setup."""

    status: CopyStatus = Field(
        default="none",
        description="none: nothing configured or nothing matched; ok: every match copied; "
        "capped: the size cap (`[create] copy_max_bytes`) stopped the copy: `skipped` lists "
        "the entries not copied (whole entries: never half a directory).",
    )
    paths: list[str] = Field(
        default_factory=list,
        description="The entries copied (relative; a directory ends with '/'). At most 1000.",
    )
    files: int = Field(default=0, description="Files and symlinks written.")
    bytes: int = Field(default=0, description="Allocated bytes of the files copied.")
    cloned: int = Field(
        default=0, description="Files shared copy-on-write (FICLONE): they cost no space yet."
    )
    copied: int = Field(default=0, description="Files whose data was copied.")
    elapsed_s: float = 0.0
    skipped: list[str] = Field(
        default_factory=list, description="With `capped`: entries not copied. At most 1000."
    )
    existing: list[str] = Field(
        default_factory=list,
        description="Entries already in the checkout (unarchive: restored or preserved), left "
        "as they are.",
    )
    special: list[str] = Field(
        default_factory=list, description="Named pipes, sockets, devices: never copied."
    )
    mounts: list[str] = Field(
        default_factory=list,
        description="Directories on another mount inside a matched entry: not entered.",
    )
    limit_bytes: int = Field(default=0, description="The cap that applied.")


class PortChange(Result):
    """A port replaced by another at the same position (and name): one of an archived workspace
    taken meanwhile, replaced at unarchive, or one replaced on request (workspace.ports)."""

    old: int
    new: int


class PortTaken(Result):
    """A port of the workspace that a process outside it listens on now."""

    port: int
    name: str | None = Field(default=None, description="Its name (`[ports] names`), if any.")
    pid: int | None = Field(
        default=None, description="The listener's pid; null when it cannot be read."
    )
    command: str | None = Field(default=None, description="The listener's command line, cut.")
