"""`workspace.list` at scale: one query, rows straight to the answer's JSON values.

The model path (`Context.info` per row: a `WorkspaceInfo` validated, then dumped by the dispatcher,
plus a query each for the row's cleanup obligations, ports and environment) costs about four
times this direct path on 10,000 rows the API wrote (docs/PERFORMANCE.md, "Copies kept for
speed").
Here the workspaces come with their ports, environment and whether they have obligations in one
query (correlated subqueries on indexed columns), the obligations of the listed workspaces in a
second, and each row becomes the dict that `WorkspaceInfo.model_dump(mode="json")` would give,
built directly. The answer is serialised once, by the transport.

Every shape the daemon writes is built directly, including its stored JSON columns: the setup's
outcome (an object on every row that went through create, even when no setup ran), the cleanup
status kept for when the obligations are purged, an auto-archive outcome. Such a column is read
field by field in its model's field order, and only when every field has the exact type the model
would dump it as (a float where it wants a float, no unknown key: `extra="allow"` would keep one).
Anything else the model would reshape or refuse (unreadable or odd stored JSON, a value outside its
literal set, a path `Path()` would normalise) goes through the model path, so the answer is
byte-for-byte what the model path gives for the same rows
(`tests/lifecycle/test_workspace_list_paging.py` compares the two on a hostile mix of rows, and
checks that rows made through the API are built here).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
from xum_protocol.cursor import list_cursor, parse_list_cursor

from xumd.cleanup.obligations import ObligationRow
from xumd.cleanup.status import status_of
from xumd.lifecycle import rows
from xumd.store import Store

_RUNTIMES = frozenset({"worktree", "directory"})
_STATES = frozenset({"creating", "active", "archiving", "archived", "restoring", "removing"})
_SCRIPT = frozenset({"pending", "running", "ok", "failed", "timeout", "untrusted", "none"})
_CLEANUP = frozenset({"completed", "pending", "not_needed", "failed"})  # also the reclaim's
_SIGNALS = frozenset({"SIGTERM", "SIGKILL"})

# The columns a listing reads, in the order `row_json` unpacks them: tuples, not sqlite3.Row,
# whose lookup by name scans the column names (about 5x slower over the ~25 reads of a row).
_COLUMNS = (
    "id, project_id, name, runtime, path, branch, base, state, incarnation, interrupted,"
    " interrupted_reason, setup_status, setup_output, snapshot_ref, snapshot_commit,"
    " last_cleanup, handle_id, owner_workspace_id, auto_archive, auto_archive_outcome,"
    " created_at, updated_at"
)
_ID = 0
_ENV, _SETUP_OUTPUT, _LAST_CLEANUP, _OUTCOME, _PATH = 23, 12, 15, 19, 4
_OBS, _SEQ = 24, 25
# Ports as "position:port:name" triples (name empty when anonymous; group_concat's order is
# unspecified before SQLite 3.44: the position sorts them here), the environment's JSON text,
# and whether any obligation exists.
_SELECT = (
    "SELECT "
    + ", ".join(f"w.{c.strip()}" for c in _COLUMNS.split(","))
    + ", (SELECT group_concat(p.position || ':' || p.port || ':' || coalesce(p.name, ''))"
    " FROM workspace_ports p"
    "  WHERE p.workspace_id = w.id) AS x_ports,"
    " (SELECT e.env FROM workspace_env e WHERE e.workspace_id = w.id) AS x_env,"
    " EXISTS (SELECT 1 FROM cleanup_obligations o WHERE o.workspace_id = w.id) AS x_obs,"
    " w.listing_seq"
    " FROM workspaces w"
)


PAGE_BYTES = 4 * 1024 * 1024
"""A page (`limit` given) is also cut when its rows' estimated answer passes this: the largest
workspace row is ~200 KiB (64 KiB of environment, setup output, stored statuses), so a page stays
well under a client's 16 MiB frame cap whatever `limit` says. `next` says that more follow."""

_ROW_BYTES = 1024
"""The estimate of a row's fixed part (ids, path, names, times, the setup and cleanup objects)."""


def _estimate(row: Any, obligations: list[ObligationRow] | None) -> int:
    """About the JSON size of a row's answer: the fixed part plus its free-size text columns
    (already JSON or plain text, about their size once serialised), and the text its cleanup
    status takes from its obligations (a last error keeps up to 4,000 characters of diagnostic
    tail, which no column of the row holds)."""
    size = _ROW_BYTES
    for column in (_ENV, _SETUP_OUTPUT, _LAST_CLEANUP, _OUTCOME, _PATH):
        value = row[column]
        if isinstance(value, str):
            size += len(value)
    for ob in obligations or ():
        size += len(ob.id) + len(ob.last_error or "") + len(ob.reason or "")
    return size


def _where(project_id: str | None, state: str | None, after: str | None) -> tuple[str, list[Any]]:
    sql, args = rows.workspace_filter(project_id, state)
    if after is not None:
        # Keyset paging on the listing order (the number each workspace got when it was
        # recorded, which only grows): rows created or removed between pages move no other row
        # across the cursor, a new row always comes after it whatever its clock said, and the
        # cursor's own row need not exist any more.
        place = parse_list_cursor(after)
        if isinstance(place, int):
            sql += " AND w.listing_seq > ?"
            args.append(place)
        else:
            # An earlier daemon's cursor, a place in (creation time, id): migration 0012
            # numbered the rows that daemon knew in that order, so the place is after the last
            # of those at or before it (a later row's clock says nothing of where it was).
            sql += (
                " AND w.listing_seq > (SELECT coalesce(max(listing_seq), 0) FROM workspaces"
                " WHERE listing_seq <= (SELECT numbered FROM workspace_listing_counter)"
                " AND (created_at, id) <= (?, ?))"
            )
            args += list(place)
    return sql, args


def select(
    store: Store,
    *,
    project_id: str | None = None,
    state: str | None = None,
    limit: int | None = None,
    after: str | None = None,
) -> tuple[list[tuple[Any, ...]], dict[str, list[ObligationRow]], str | None]:
    """The rows of one listing (or page), the obligations of those that have any, and the
    cursor of the next page (None when this one ends the listing). Synchronous and without an
    await between the two queries: no write lands between them (one connection, one loop)."""
    where, args = _where(project_id, state, after)
    sql = _SELECT + where + rows.LISTING_ORDER
    if limit is not None:
        sql += " LIMIT ?"
        args.append(limit + 1)  # one more row says whether a next page exists
    cursor = store.execute(sql, args)
    cursor.row_factory = None  # plain tuples (see _COLUMNS)
    found: list[tuple[Any, ...]] = cursor.fetchall()
    # The obligations of every row read, before the page is cut: their text counts against the
    # page's bytes. (The row read past `limit` only says whether a next page exists: its
    # obligations are read for nothing, and it is dropped below.)
    obligations = _obligations(
        store, found, where, args, paged=limit is not None or after is not None
    )
    following = None
    if limit is not None:
        keep = min(len(found), limit)
        total = 0
        for index in range(keep):
            total += _estimate(found[index], obligations.get(found[index][_ID]))
            if total > PAGE_BYTES and index > 0:
                keep = index  # this row starts the next page
                break
        if len(found) > keep:
            found = found[:keep]
            last = found[-1]
            following = list_cursor(last[_SEQ])
    return found, obligations, following


def _obligations(
    store: Store, found: list[tuple[Any, ...]], where: str, args: list[Any], *, paged: bool
) -> dict[str, list[ObligationRow]]:
    """The obligations of the rows in `found` that have any, by workspace, in one query."""
    wanted = [r[_ID] for r in found if r[_OBS]]
    obligations: dict[str, list[ObligationRow]] = {}
    if wanted:
        # The same rows and order as `Obligations.for_workspace`, for every listed workspace.
        if not paged:
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
    return obligations


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
    return value is None or type(value) is str


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


def _ports(text: Any) -> tuple[list[int], dict[str, int]] | None:
    """`ports.ports_of` and `ports.named_ports` on the triples already read; None when they are
    not what those would read."""
    if text is None:
        return [], {}
    triples: list[tuple[int, int, str]] = []
    try:
        for triple in text.split(","):
            position, port, name = triple.split(":")
            triples.append((int(position), int(port), name))
    except ValueError:
        return None
    triples.sort()
    return [port for _, port, _ in triples], {name: port for _, port, name in triples if name}


class _Odd(Exception):
    """A stored value the direct path does not build: the row goes through the model path."""


def _text(value: Any) -> str:
    if type(value) is not str:
        raise _Odd
    return value


def _opt_text(value: Any) -> str | None:
    if value is not None and type(value) is not str:
        raise _Odd
    return value


def _count(value: Any) -> int:
    # Not a bool (the model would turn it into 0/1) and not a float (it would turn 2.0 into 2).
    if type(value) is not int:
        raise _Odd
    return value


def _opt_count(value: Any) -> int | None:
    return None if value is None else _count(value)


def _opt_time(value: Any) -> float | None:
    # The daemon writes times as floats; an int would be dumped as a float by the model.
    if value is not None and type(value) is not float:
        raise _Odd
    return value


def _one_of(value: Any, allowed: frozenset[str]) -> str:
    if type(value) is not str or value not in allowed:
        raise _Odd
    return value


def _texts(value: Any) -> list[str]:
    if type(value) is not list or any(type(v) is not str for v in value):
        raise _Odd
    return list(value)


def _fields(value: dict[str, Any], known: frozenset[str]) -> dict[str, Any]:
    """`value` when every key is a field of its model (an extra key would be kept by the model,
    after the fields: not built here)."""
    if not known.issuperset(value):
        raise _Odd
    return value


def _stored(text: Any) -> dict[str, Any] | None:
    """A stored JSON column as `views._stored` reads it, before validation: None when empty; an
    object; anything else (unreadable, not an object) is left to the model path."""
    if not text:
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise _Odd from None
    if type(value) is not dict:
        raise _Odd
    return value


_SETUP_FIELDS = frozenset(
    {"status", "output", "error", "config_hash", "hint", "commands", "leftovers"}
)
_LEFTOVER_FIELDS = frozenset({"pid", "argv", "signal", "ran_s"})
_CLEANUP_FIELDS = frozenset(
    {"status", "attempts", "next_attempt_at", "last_error", "reason", "reclaim", "obligations"}
)
_RECLAIM_FIELDS = frozenset({"status", "bytes"})
_OUTCOME_FIELDS = frozenset({"status", "attempts", "error", "process_id", "at", "next_attempt_at"})


Memo = dict[tuple[Any, Any], dict[str, Any]]
"""The setup results one listing has built, by (status, stored text): most rows of a root hold
the same few outcomes (every create without a setup stores the same one)."""


def _setup(status: str, text: Any, memo: Memo) -> dict[str, Any]:
    """`_setup_of`, once per distinct outcome of a listing; each row gets a dict of its own (the
    answer's values are not shared between rows, whoever holds them after)."""
    found = memo.get((status, text))
    if found is None:
        found = memo[(status, text)] = _setup_of(status, text)
    return {**found, "leftovers": [dict(item) for item in found["leftovers"]]}


def _setup_of(status: str, text: Any) -> dict[str, Any]:
    """`ScriptResult` of the row's setup status and stored outcome (`WorkspaceRow.setup_detail`:
    the status column wins over a `status` in the JSON)."""
    if text:
        try:
            detail = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise _Odd from None
        if type(detail) is not dict:
            raise _Odd
        _fields(detail, _SETUP_FIELDS)
    else:
        detail = {}
    leftovers = detail.get("leftovers", [])
    if type(leftovers) is not list:
        raise _Odd
    return {
        "status": status,
        "output": _text(detail.get("output", "")),
        "error": _opt_text(detail.get("error")),
        "config_hash": _opt_text(detail.get("config_hash")),
        "hint": _opt_text(detail.get("hint")),
        "commands": _count(detail.get("commands", 0)),
        "leftovers": [_leftover(item) for item in leftovers],
    }


def _leftover(item: Any) -> dict[str, Any]:
    if type(item) is not dict:
        raise _Odd
    _fields(item, _LEFTOVER_FIELDS)
    if "pid" not in item or "argv" not in item or "signal" not in item:
        raise _Odd
    return {
        "pid": _count(item["pid"]),
        "argv": _texts(item["argv"]),
        "signal": _one_of(item["signal"], _SIGNALS),
        "ran_s": _opt_time(item.get("ran_s")),
    }


def _cleanup(value: dict[str, Any]) -> dict[str, Any]:
    """A stored `CleanupStatus` (what cleanup keeps in `last_cleanup`) as the model dumps it."""
    _fields(value, _CLEANUP_FIELDS)
    if "status" not in value:
        raise _Odd
    reclaim = value.get("reclaim")
    if reclaim is not None:
        if type(reclaim) is not dict or "status" not in _fields(reclaim, _RECLAIM_FIELDS):
            raise _Odd
        reclaim = {
            "status": _one_of(reclaim["status"], _CLEANUP),
            "bytes": _opt_count(reclaim.get("bytes")),
        }
    return {
        "status": _one_of(value["status"], _CLEANUP),
        "attempts": _count(value.get("attempts", 0)),
        "next_attempt_at": _opt_time(value.get("next_attempt_at")),
        "last_error": _opt_text(value.get("last_error")),
        "reason": _opt_text(value.get("reason")),
        "reclaim": reclaim,
        "obligations": _texts(value.get("obligations", [])),
    }


def _outcome(value: dict[str, Any]) -> dict[str, Any]:
    """A stored `AutoArchiveOutcome` as the model dumps it."""
    _fields(value, _OUTCOME_FIELDS)
    if "status" not in value:
        raise _Odd
    return {
        "status": _text(value["status"]),
        "attempts": _count(value.get("attempts", 0)),
        "error": _opt_text(value.get("error")),
        "process_id": _opt_text(value.get("process_id")),
        "at": _opt_time(value.get("at")),
        "next_attempt_at": _opt_time(value.get("next_attempt_at")),
    }


def row_json(
    row: tuple[Any, ...],
    obligations: list[ObligationRow] | None,
    fallback: Callable[[str], dict[str, Any]],
    memo: Memo | None = None,
) -> dict[str, Any]:
    """`WorkspaceInfo.model_dump(mode="json")` of one selected row, built directly when the row
    has a shape the daemon writes; `fallback(id)` (the model path) otherwise. `memo`: shared by
    the rows of one listing."""
    (
        ws_id,
        project_id,
        name,
        runtime,
        path,
        branch,
        base,
        state,
        incarnation,
        interrupted,
        interrupted_reason,
        setup_status,
        setup_output,
        snapshot_ref,
        snapshot_commit,
        last_cleanup,
        handle_id,
        owner_workspace_id,
        auto_archive,
        auto_archive_outcome,
        created_at,
        updated_at,
        x_ports,
        x_env,
        _,
        _,
    ) = row
    held = _ports(x_ports)
    if (
        held is None
        or runtime not in _RUNTIMES
        or state not in _STATES
        or setup_status not in _SCRIPT
        or auto_archive not in (None, "on_agent_exit")
        or not _plain_path(path)
        or type(ws_id) is not str
        or type(project_id) is not str
        or type(name) is not str
        or type(incarnation) is not str
        or not (_opt_str(branch) and _opt_str(base) and _opt_str(interrupted_reason))
        or not (_opt_str(handle_id) and _opt_str(owner_workspace_id))
        or type(interrupted) is not int
        or interrupted not in (0, 1)
        or type(created_at) not in (float, int)
        or type(updated_at) not in (float, int)
    ):
        return fallback(str(ws_id))
    if snapshot_ref and snapshot_commit:
        if type(snapshot_ref) is not str or type(snapshot_commit) is not str:
            return fallback(ws_id)
        snapshot: dict[str, Any] | None = {
            "ref": snapshot_ref,
            "commit": snapshot_commit,
            "files": [],
        }
    else:
        snapshot = None
    try:
        setup = _setup(setup_status, setup_output, {} if memo is None else memo)
        if obligations:
            # The obligations' own status wins over the stored one (`views._last_cleanup`),
            # which only answers once they are purged.
            live = status_of(obligations)
            cleanup = live.model_dump(mode="json") if live is not None else None
        else:
            stored = _stored(last_cleanup)
            cleanup = _cleanup(stored) if stored is not None else None
        stored = _stored(auto_archive_outcome)
        outcome = _outcome(stored) if stored is not None else None
    except _Odd:
        return fallback(ws_id)
    return {
        "id": ws_id,
        "project_id": project_id,
        "name": name,
        "runtime": runtime,
        "path": path,
        "branch": branch,
        "base": base,
        "state": state,
        "incarnation": incarnation,
        "interrupted": interrupted == 1,
        "interrupted_reason": interrupted_reason,
        "setup": setup,
        "snapshot": snapshot,
        "last_cleanup": cleanup,
        "handle_id": handle_id,
        "owner_workspace_id": owner_workspace_id,
        "auto_archive": auto_archive,
        "auto_archive_outcome": outcome,
        "ports": held[0],
        "named_ports": held[1],
        "env": _env(x_env) if x_env is not None else {},
        "created_at": float(created_at),
        "updated_at": float(updated_at),
    }


def listing(
    store: Store,
    fallback: Callable[[str], dict[str, Any]],
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
    memo: Memo = {}
    return {
        "workspaces": [row_json(r, obligations.get(r[_ID]), fallback, memo) for r in found],
        "next": following,
    }
