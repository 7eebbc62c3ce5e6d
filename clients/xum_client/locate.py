"""Which workspace the caller is in: what `xum self` and the MCP tool `current_workspace` answer.

Light (no pydantic): it works on the dicts the daemon answers, through the caller's own `call`
(the sync client's, or the async one's), with methods the daemon already has: `workspace.get`
or `workspace.list`, then `process.list`.

The workspace is the one `XUM_WORKSPACE_ID` names (the daemon sets it for every process it
starts in a workspace, and for its setup and teardown), else the one whose checkout holds the
current directory. A directory is in a checkout when the checkout is that directory or one of
its ancestors, compared by device and inode, never by a string prefix: `/w/fix` is not inside
`/w/fix-login`, and a checkout reached through a symlink or a bind mount is still the same
directory. The innermost checkout wins (a directory workspace may hold another one's path).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from xum_client.errors import NotFound
from xum_client.paging import aiter_workspaces, iter_workspaces

WORKSPACE_ENV = "XUM_WORKSPACE_ID"

Call = Callable[[str, dict[str, Any]], dict[str, Any]]
AsyncCall = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


def _identity(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def containing(workspaces: Iterable[dict[str, Any]], cwd: str) -> dict[str, Any] | None:
    """The workspace whose checkout holds `cwd`, or None.

    Workspaces without a checkout of their own on disk (archived, still being created) never
    match: their path names nothing, or something that is not theirs yet."""
    by_identity: dict[tuple[int, int], dict[str, Any]] = {}
    for workspace in workspaces:
        if workspace.get("state") in ("archived", "creating"):
            continue
        key = _identity(workspace.get("path") or "")
        if key is not None:
            by_identity.setdefault(key, workspace)
    if not by_identity:
        return None
    here = Path(os.path.realpath(cwd))
    for directory in (here, *here.parents):
        key = _identity(directory)
        if key is not None and key in by_identity:
            return by_identity[key]
    return None


def _not_found(message: str) -> NotFound:
    return NotFound(-32001, message, {"kind": "not_found"})


def _from_env(environ: Mapping[str, str]) -> str | None:
    return environ.get(WORKSPACE_ENV) or None


def _outside(cwd: str) -> NotFound:
    return _not_found(
        f"{cwd} is not inside any workspace's checkout and {WORKSPACE_ENV} is not set: run it "
        f"from a workspace's directory (`xum ws path NAME`), or set {WORKSPACE_ENV}"
    )


def _unknown_env(workspace_id: str, exc: NotFound) -> NotFound:
    return _not_found(f"{WORKSPACE_ENV}={workspace_id}: {exc.message}")


def _answer(workspace: dict[str, Any], processes: dict[str, Any], found_by: str) -> dict[str, Any]:
    return {"workspace": workspace, "processes": processes["processes"], "found_by": found_by}


def current(call: Call, cwd: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """`{workspace, processes, found_by}` (`found_by`: `env` or `cwd`); `NotFound` when the
    caller is in no workspace (or the env names one the daemon does not know)."""
    workspace_id = _from_env(environ)
    if workspace_id is not None:
        try:
            workspace = call("workspace.get", {"workspace_id": workspace_id})["workspace"]
        except NotFound as exc:
            raise _unknown_env(workspace_id, exc) from None
        found_by = "env"
    else:
        found = containing(iter_workspaces(call), cwd)
        if found is None:
            raise _outside(cwd)
        workspace, found_by = found, "cwd"
    return _answer(workspace, call("process.list", {"workspace_id": workspace["id"]}), found_by)


async def acurrent(call: AsyncCall, cwd: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """`current` for the async client."""
    workspace_id = _from_env(environ)
    if workspace_id is not None:
        try:
            workspace = (await call("workspace.get", {"workspace_id": workspace_id}))["workspace"]
        except NotFound as exc:
            raise _unknown_env(workspace_id, exc) from None
        found_by = "env"
    else:
        found = containing([ws async for ws in aiter_workspaces(call)], cwd)
        if found is None:
            raise _outside(cwd)
        workspace, found_by = found, "cwd"
    processes = await call("process.list", {"workspace_id": workspace["id"]})
    return _answer(workspace, processes, found_by)
