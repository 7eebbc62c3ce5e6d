"""What a project's config asks of a new workspace: `[create] copy`, the
repository's `.worktreeinclude`, `[create] fetch`, `[create] pool`, `[ports] count` and `names`,
and `[env]`. The
one reader of the `[create]` table (lifecycle/basefetch.py takes `fetch` from here).

They are read from the project's main checkout at create, before the new checkout exists (the
copy's source is that checkout too). None of them runs code, so none needs the config to be
trusted. A config that breaks their rules refuses the create (`invalid_params`, naming the
file) instead of creating a workspace without what it asked for.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xum_protocol.errors import ErrorKind
from xum_protocol.models.wsenv import env_problem

from xumd.base.config import MAX_PORTS
from xumd.base.errors import XumError
from xumd.lifecycle import ports
from xumd.lifecycle.scripts import CONFIG_RELPATH, MAX_CONFIG_BYTES
from xumd.system import smallfile

WORKTREEINCLUDE = ".worktreeinclude"
MAX_PATTERNS = 1000
MAX_POOL = 16


@dataclass(frozen=True, slots=True)
class CreateSettings:
    copy: list[str] = field(default_factory=list)
    """gitignore-style patterns: `[create] copy` then the lines of `.worktreeinclude`."""
    ports: int | None = None
    port_names: list[str] = field(default_factory=list)
    """`[ports] names`: the first ports' names (XUM_PORT_<NAME>), in order."""
    env: dict[str, str] = field(default_factory=dict)
    fetch: object = False
    """`[create] fetch` as written: checked only where a create consults it (`wants_fetch`),
    so a wrong type refuses a create that would fetch, not an unarchive or a directory."""
    path: Path | None = None
    pool: int | None = None
    """`[create] pool`: warm checkouts kept at the base (lifecycle/pool/); None: the root's."""

    def wants_fetch(self) -> bool:
        return _fetch_value(self.fetch, self.path)


def _bad(path: Path, message: str) -> XumError:
    return XumError(ErrorKind.INVALID_PARAMS, f"{path}: {message}", config=str(path))


def _table(data: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise _bad(path, f"[{key}] must be a table")
    return value


def _patterns_file(path: Path) -> list[str]:
    """The patterns of a `.worktreeinclude` (gitignore syntax: blank lines and # comments
    are skipped by git itself; they are kept out here only to count patterns honestly)."""
    try:
        raw = smallfile.read_regular(path, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise _bad(path, f"cannot read it: {exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(path, "not UTF-8") from None
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def read(project_path: Path) -> dict[str, Any]:
    """The parsed `.xum/config.toml` of the main checkout ({} when there is none). Read
    without blocking (a FIFO or a device there is unreadable: xumd.system.smallfile)."""
    path = project_path / CONFIG_RELPATH
    try:
        raw = smallfile.read_regular(path, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise _bad(path, f"cannot read it: {exc}") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _bad(path, f"not valid TOML: {exc}") from None


def _fetch_value(value: object, path: Path | None) -> bool:
    if not isinstance(value, bool):
        raise XumError(
            ErrorKind.INVALID_PARAMS,
            f"{path}: [create] fetch must be true or false",
            config=str(path),
            path=str(path),
        )
    return value


def load(project_path: Path) -> CreateSettings:
    path = project_path / CONFIG_RELPATH
    data = read(project_path)
    create = _table(data, "create", path)
    copy = create.get("copy", [])
    if not isinstance(copy, list) or not all(isinstance(p, str) for p in copy):
        raise _bad(path, "[create] copy must be a list of strings (gitignore-style patterns)")
    if any("\0" in p or "\n" in p or "\r" in p for p in copy):
        raise _bad(path, "[create] copy: a pattern contains a NUL or line break")
    copy = [p for p in copy if p.strip()] + _patterns_file(project_path / WORKTREEINCLUDE)
    if len(copy) > MAX_PATTERNS:
        raise _bad(path, f"{len(copy)} copy patterns; at most {MAX_PATTERNS}")
    ports_table = _table(data, "ports", path)
    count = ports_table.get("count")
    if count is not None and (
        isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_PORTS
    ):
        raise _bad(path, f"[ports] count must be an integer from 0 to {MAX_PORTS}")
    names = ports_table.get("names", [])
    problem = ports.names_problem(names)
    if problem:
        raise _bad(path, problem)
    if len(names) > MAX_PORTS:
        raise _bad(path, f"[ports] names: {len(names)} names; at most {MAX_PORTS}")
    if count is not None and count < len(names):
        raise _bad(path, f"[ports] count ({count}) is below the number of names ({len(names)})")
    env = data.get("env", {})
    problem = env_problem(env, "[env]")
    if problem:
        raise _bad(path, problem)
    fetch = create.get("fetch", False)
    return CreateSettings(
        copy=copy,
        ports=count,
        port_names=names,
        env=dict(env),
        fetch=fetch,
        path=path,
        pool=_pool(create),
    )


def _pool(create: dict[str, Any]) -> int | None:
    """Nothing about a pool fails a create: a value outside 0..MAX_POOL means no pool."""
    value = create.get("pool")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_POOL:
        return 0
    return value
