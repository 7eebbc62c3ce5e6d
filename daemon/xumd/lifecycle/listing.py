"""`workspace.list` at scale: one query, rows straight to the answer's JSON values.

The model path (`Context.info` per row: a `WorkspaceInfo` validated, then dumped by the dispatcher,
plus a query each for the row's cleanup obligations, ports and environment) costs ~40 µs a row.
Here the workspaces come with their ports, environment and whether they have obligations in one
query (correlated subqueries on indexed columns), the obligations of the listed workspaces in a
second, and each row becomes the dict that `WorkspaceInfo.model_dump(mode="json")` would give,
built directly. The answer is serialised once, by the transport.

Only the common shape is built directly; a row with anything the model would reshape or refuse
(stored JSON of another feature: setup output, an auto-archive outcome, a stored cleanup status;
a value outside its literal set; a path `Path()` would normalise) goes through the model path, so
the answer is byte-for-byte what the model path gives for the same rows
(`tests/test_workspace_list_paging.py` compares the two on a hostile mix of rows).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from xum_protocol.cursor import list_cursor, parse_list_cursor

from xumd.cleanup.obligations import ObligationRow
from xumd.cleanup.status import status_of
from xumd.lifecycle.rows import WorkspaceRow
from xumd.store import Store

_RUNTIMES = frozenset({"worktree", "directory"})
_STATES = frozenset({"creating", "active", "archiving", "archived", "restoring", "removing"})
_SCRIPT = frozenset({"pending", "running", "ok", "failed", "timeout", "untrusted", "none"})

# Ports as "position:port" pairs (group_concat's order is unspecified before SQLite 3.44: the
# position sorts them here), the environment's JSON text, and whether any obligation exists.
_SELECT = (
    "SELECT w.*,"
    " (SELECT group_concat(p.position || ':' || p.port) FROM workspace_ports p"
    "  WHERE p.workspace_id = w.id) AS x_ports,"
    " (SELECT e.env FROM workspace_env e WHERE e.workspace_id = w.id) AS x_env,"
    " EXISTS (SELECT 1 FROM cleanup_obligations o WHERE o.workspace_id = w.id) AS x_obs"
    " FROM workspaces w"
)
_ORDER = " ORDER BY w.created_at, w.id"


PAGE_BYTES = 4 * 1024 * 1024
"""A page (`limit` given) is also cut when its rows' estimated answer passes this: the largest
workspace row is ~200 KiB (64 KiB of environment, setup output, stored statuses), so a page stays
well under a client's 16 MiB frame cap whatever `limit` says. `next` says that more follow."""

_ROW_BYTES = 1024
"""The estimate of a row's fixed part (ids, path, names, times, the setup and cleanup objects)."""


def _estimate(row: Any) -> int:
    """About the JSON size of a row's answer: the fixed part plus its free-size text columns
    (already JSON or plain text, about their size once serialised)."""
    size = _ROW_BYTES
    for column in ("x_env", "setup_output", "last_cleanup", "auto_archive_outcome", "path"):
        value = row[column]
        if isinstance(value, str):
            size += len(value)
    return size


class JsonResult(BaseModel):
    """A result already in its JSON form (plain dicts and lists): the dispatcher dumps a result
    with `model_dump(mode="json")`, which here is the value itself, not a second pass."""

    value: dict[str, Any]

    def model_dump(self, **_: Any) -> dict[str, Any]:
        return self.value


def _where(project_id: str | None, state: str | None, after: str | None) -> tuple[str, list[Any]]:
    sql = " WHERE 1=1"
    args: list[Any] = []
    if project_id is not None:
        sql += " AND w.project_id = ?"
        args.append(project_id)
    if state is not None:
        sql += " AND w.state = ?"
        args.append(state)
    if after is not None:
        # Keyset paging on the listing order: rows created or removed between pages move no
        # other row across the cursor, and the cursor's own row need not exist any more.
        created_at, workspace_id = parse_list_cursor(after)
        # A row value: SQLite seeks the (created_at, id) index to it, where the OR form
        # scans every row of an equal creation time.
        sql += " AND (w.created_at, w.id) > (?, ?)"
        args += [created_at, workspace_id]
    return sql, args


def select(
    store: Store,
    *,
    project_id: str | None = None,
    state: str | None = None,
    limit: int | None = None,
    after: str | None = None,
) -> tuple[list[Any], dict[str, list[ObligationRow]], str | None]:
    """The rows of one listing (or page), the obligations of those that have any, and the
    cursor of the next page (None when this one ends the listing). Synchronous and without an
    await between the two queries: no write lands between them (one connection, one loop)."""
    where, args = _where(project_id, state, after)
    sql = _SELECT + where + _ORDER
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit + 1)  # one more row says whether a next page exists
    found = store.all(sql, args)
    following = None
    if limit is not None:
        keep = min(len(found), limit)
        total = 0
        for index in range(keep):
            total += _estimate(found[index])
            if total > PAGE_BYTES and index > 0:
                keep = index  # this row starts the next page
                break
        if len(found) > keep:
            found = found[:keep]
            last = found[-1]
            following = list_cursor(last["created_at"], last["id"])
    wanted = [r["id"] for r in found if r["x_obs"]]
    obligations: dict[str, list[ObligationRow]] = {}
    if wanted:
        # The same rows and order as `Obligations.for_workspace`, for every listed workspace.
        if limit is None and after is None:
            ob_sql = (
                "SELECT o.* FROM cleanup_obligations o JOIN workspaces w ON w.id = o.workspace_id"
                + where
                + " ORDER BY o.workspace_id, o.seq, o.created_at"
            )
            ob_args: list[Any] = list(args)
        else:
            ob_sql = (
                "SELECT o.* FROM cleanup_obligations o WHERE o.workspace_id IN"
                " (SELECT value FROM json_each(?)) ORDER BY o.workspace_id, o.seq, o.created_at"
            )
            ob_args = [json.dumps(wanted)]
        for ob in store.all(ob_sql, ob_args):
            obligations.setdefault(ob["workspace_id"], []).append(ObligationRow.of(ob))
    return found, obligations, following


def _plain_path(text: Any) -> bool:
    """True when `str(Path(text)) == text`: absolute, no empty or '.' components, no trailing
    slash (the model path shows a row's path through `Path`)."""
    return (
        isinstance(text, str)
        and text.startswith("/")
        and len(text) > 1
        and "//" not in text
        and "/./" not in text
        and not text.endswith(("/", "/."))
    )


def _opt_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _env(text: Any) -> dict[str, str]:
    """`wsenv.env_of` on the column already read."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except (ValueError, TypeError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def _ports(text: Any) -> list[int] | None:
    """`ports.ports_of` on the pairs already read; None when they are not what it would read."""
    if text is None:
        return []
    try:
        pairs = sorted(tuple(int(part) for part in pair.split(":")) for pair in text.split(","))
    except ValueError:
        return None
    if any(len(pair) != 2 for pair in pairs):
        return None
    return [port for _, port in pairs]


def row_json(
    row: Any,
    obligations: list[ObligationRow] | None,
    fallback: Callable[[WorkspaceRow], dict[str, Any]],
) -> dict[str, Any]:
    """`WorkspaceInfo.model_dump(mode="json")` of one selected row, built directly when the row
    has the common shape; `fallback` (the model path) otherwise."""
    ports = _ports(row["x_ports"])
    created_at, updated_at = row["created_at"], row["updated_at"]
    if (
        ports is None
        or row["setup_output"]
        or row["last_cleanup"] is not None
        or row["auto_archive_outcome"] is not None
        or row["runtime"] not in _RUNTIMES
        or row["state"] not in _STATES
        or row["setup_status"] not in _SCRIPT
        or row["auto_archive"] not in (None, "on_agent_exit")
        or not _plain_path(row["path"])
        or not (isinstance(row["id"], str) and isinstance(row["project_id"], str))
        or not (isinstance(row["name"], str) and isinstance(row["incarnation"], str))
        or not (_opt_str(row["branch"]) and _opt_str(row["base"]))
        or not (_opt_str(row["handle_id"]) and _opt_str(row["owner_workspace_id"]))
        or not _opt_str(row["interrupted_reason"])
        or row["interrupted"] not in (0, 1)
        or not isinstance(created_at, float | int)
        or not isinstance(updated_at, float | int)
        or isinstance(created_at, bool)
        or isinstance(updated_at, bool)
    ):
        return fallback(WorkspaceRow.of(row))
    cleanup = status_of(obligations) if obligations else None
    snapshot_ref, snapshot_commit = row["snapshot_ref"], row["snapshot_commit"]
    if snapshot_ref and snapshot_commit:
        if not (isinstance(snapshot_ref, str) and isinstance(snapshot_commit, str)):
            return fallback(WorkspaceRow.of(row))
        snapshot: dict[str, Any] | None = {
            "ref": snapshot_ref,
            "commit": snapshot_commit,
            "files": [],
        }
    else:
        snapshot = None
    return {
        "id": row["id"],
        "project_id": row["project_id"],
        "name": row["name"],
        "runtime": row["runtime"],
        "path": row["path"],
        "branch": row["branch"],
        "base": row["base"],
        "state": row["state"],
        "incarnation": row["incarnation"],
        "interrupted": bool(row["interrupted"]),
        "interrupted_reason": row["interrupted_reason"],
        "setup": {
            "status": row["setup_status"],
            "output": "",
            "error": None,
            "config_hash": None,
            "hint": None,
            "commands": 0,
        },
        "snapshot": snapshot,
        "last_cleanup": cleanup.model_dump(mode="json") if cleanup is not None else None,
        "handle_id": row["handle_id"],
        "owner_workspace_id": row["owner_workspace_id"],
        "auto_archive": row["auto_archive"],
        "auto_archive_outcome": None,
        "ports": ports,
        "env": _env(row["x_env"]),
        "created_at": float(created_at),
        "updated_at": float(updated_at),
    }


def listing(
    store: Store,
    fallback: Callable[[WorkspaceRow], dict[str, Any]],
    *,
    project_id: str | None = None,
    state: str | None = None,
    limit: int | None = None,
    after: str | None = None,
) -> dict[str, Any]:
    """The `WorkspaceListResult` of these params as its JSON value."""
    found, obligations, following = select(
        store, project_id=project_id, state=state, limit=limit, after=after
    )
    return {
        "workspaces": [row_json(r, obligations.get(r["id"]), fallback) for r in found],
        "next": following,
    }
