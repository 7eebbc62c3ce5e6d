"""The `workspace.list` paging cursor (protocol 1.2): opaque to clients, a place in the listing
order to the daemon. No pydantic here: the CLI checks a `--after` it was given before it
connects, on its light start-up path.

The listing order is the order the daemon recorded the workspaces (a sequence number that only
grows, store migration 0012), so a cursor is that number: `c2.<n>`. Daemons before it ordered by
creation time, then id, and made `c1.<base64 of "time\\nid">`; such a cursor is still read (a
client may hold one across a daemon upgrade) and resumes at the same place.
"""

from __future__ import annotations

import base64
import binascii
import math
import re

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_CURSOR_PREFIX = "c2."
_TIME_CURSOR_PREFIX = "c1."
_SEQ_MAX = 2**63 - 1  # SQLite's INTEGER
# Any form, this one or a later one: a version, a dot, URL-safe text.
_ANY_FORM_RE = re.compile(r"c[1-9][0-9]*\.[A-Za-z0-9_-]+")


def list_cursor(seq: int) -> str:
    """The cursor that resumes a listing after the workspace with this listing number: a place
    in the order, so it stays valid when that workspace is removed."""
    return f"{_CURSOR_PREFIX}{seq}"


def parse_list_cursor(cursor: str) -> int | tuple[float, str]:
    """The listing number of a cursor, or (created_at, workspace id) of an earlier daemon's
    cursor; ValueError for anything neither made (a clear `invalid_params`, never a silently
    empty or restarted listing)."""
    bad = ValueError("not a workspace.list cursor: pass the `next` of the previous answer")
    if cursor.startswith(_CURSOR_PREFIX):
        body = cursor[len(_CURSOR_PREFIX) :]
        # Exactly what list_cursor writes: ASCII digits, no sign, no leading zero.
        if not (0 < len(body) <= 19 and body.isascii() and body.isdigit()):
            raise bad
        if body != str(int(body)):
            raise bad
        seq = int(body)
        if seq > _SEQ_MAX:
            raise bad
        return seq
    if not cursor.startswith(_TIME_CURSOR_PREFIX):
        raise bad
    body = cursor[len(_TIME_CURSOR_PREFIX) :]
    if not body or not all(c.isascii() and (c.isalnum() or c in "-_") for c in body):
        raise bad
    try:
        text = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise bad from None
    when, sep, workspace_id = text.partition("\n")
    if not sep or not workspace_id or _CONTROL_RE.search(workspace_id):
        raise bad
    try:
        created_at = float(when)
    except ValueError:
        raise bad from None
    if not math.isfinite(created_at) or when != repr(created_at):
        raise bad
    return created_at, workspace_id


def check_given_cursor(cursor: str) -> None:
    """What a client checks of a cursor it was handed, before it connects: a form it knows is
    checked whole (ValueError as `parse_list_cursor`); one of a later form (a newer daemon's,
    through `--host`) only for the shape every form has, and left to the daemon to judge."""
    known = cursor.startswith((_CURSOR_PREFIX, _TIME_CURSOR_PREFIX))
    if known or not _ANY_FORM_RE.fullmatch(cursor):
        parse_list_cursor(cursor)
