"""The environment of a workspace's children: one function builds the
XUM_* variables that setup, teardown and every supervised process get, so they are the same
everywhere (docs/CONFIGURATION.md, "The environment"). The user's part (the project's `[env]`
merged with `workspace.create {env}`) is stored with the workspace at create, in its intent
transaction, and released with its row (ON DELETE CASCADE)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from xum_protocol.models.wsenv import XUM_VARS

from xumd.checkouts.marker import WorkspaceRef
from xumd.lifecycle import ports, rows
from xumd.store import Store


def store_env(store: Store, workspace_id: str, env: Mapping[str, str]) -> None:
    """Inside the intent transaction (the values were validated: models.wsenv.env_problem)."""
    if env:
        store.execute(
            "INSERT INTO workspace_env (workspace_id, env) VALUES (?, ?)",
            (workspace_id, json.dumps(dict(env), sort_keys=True)),
        )


def env_of(store: Store, workspace_id: str) -> dict[str, str]:
    row = store.one("SELECT env FROM workspace_env WHERE workspace_id = ?", (workspace_id,))
    if row is None:
        return {}
    try:
        value = json.loads(row["env"])
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def xum_vars(
    *,
    workspace_id: str,
    name: str,
    path: Path | str,
    project_path: Path | str,
    branch: str | None,
    port_list: list[int],
    root: Path | str,
    named: dict[str, int] | None = None,
) -> dict[str, str]:
    """The one place the XUM_* variables are built. XUM_BRANCH is empty for the directory
    runtime, XUM_PORT and XUM_PORTS are empty when the workspace has no ports: every variable
    is always set, so a value inherited from the daemon's own environment never leaks through
    (and `child_base` cuts every inherited XUM_*, named ports' included). Then one
    `XUM_PORT_<NAME>` per named port."""
    found = {
        "XUM_WORKSPACE_ID": workspace_id,
        "XUM_WORKSPACE_NAME": name,
        "XUM_WORKSPACE_PATH": str(path),
        "XUM_PROJECT_PATH": str(project_path),
        "XUM_BRANCH": branch or "",
        "XUM_PORT": str(port_list[0]) if port_list else "",
        "XUM_PORTS": ",".join(str(p) for p in port_list),
        "XUM_ROOT": str(root),
    }
    assert tuple(found) == XUM_VARS  # the documented table and this function agree
    for port_name, port in (named or {}).items():
        found[f"XUM_PORT_{port_name.upper()}"] = str(port)
    return found


def for_workspace(
    store: Store, root: Path, workspace_id: str
) -> tuple[dict[str, str], dict[str, str]]:
    """(the user's variables, the XUM_* variables) of a workspace, read now: a renamed
    workspace's children get its new name and path."""
    row = rows.get_workspace(store, workspace_id)
    if row is None:
        return {}, {}
    project = rows.get_project(store, row.project_id)
    return env_of(store, workspace_id), xum_vars(
        workspace_id=row.id,
        name=row.name,
        path=row.path,
        project_path=project.path if project else "",
        branch=row.branch,
        port_list=ports.ports_of(store, row.id),
        root=root,
        named=ports.named_ports(store, row.id),
    )


def _daemons(name: str) -> bool:
    """A variable the daemon sets for a workspace's children (XUM_*, named ports' included)."""
    return name in XUM_VARS or name.startswith("XUM_PORT_")


def child_base(drop: tuple[str, ...] = ()) -> dict[str, str]:
    """The daemon's environment for a child, without the XUM_* variables it may have inherited
    (they are set per workspace) and without `drop`."""
    gone = set(drop)
    return {k: v for k, v in os.environ.items() if k not in gone and not _daemons(k)}


def frozen(store: Store, workspace_id: str) -> dict[str, str]:
    """The workspace's variables as they are now (XUM_ROOT aside), for a step that may run
    after its row is gone: a removed workspace's teardown (kept in the obligation)."""
    user, xum = for_workspace(store, Path(), workspace_id)
    xum.pop("XUM_ROOT", None)
    return {**user, **xum}


def compose(
    store: Store,
    root: Path,
    ref: WorkspaceRef,
    kept: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment of a workspace's script: the daemon's (XUM_* cut), the
    workspace's own variables, then the XUM_* variables (never overridden). From its row
    while there is one; else from `kept` (see `frozen`); else what `ref` knows."""
    user, xum = for_workspace(store, root, ref.id)
    if not xum and kept:
        user = {k: v for k, v in kept.items() if not _daemons(k)}
        xum = {k: v for k, v in kept.items() if _daemons(k)}
        xum["XUM_ROOT"] = str(root)
    if not xum:
        project = rows.get_project(store, ref.project_id)
        xum = xum_vars(
            workspace_id=ref.id,
            name=ref.name,
            path=ref.path,
            project_path=project.path if project else "",
            branch=None,
            port_list=[],
            root=root,
        )
    return {**child_base(), **user, **xum}
