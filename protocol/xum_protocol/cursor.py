"""The `workspace.list` paging cursor (protocol 1.2): opaque to clients, a place in the listing
order (creation time, then id) to the daemon. No pydantic here: the CLI checks a `--after` it
was given before it connects, on its light start-up path."""

from __future__ import annotations

import base64
import binascii
import math
import re

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_CURSOR_PREFIX = "c1."


def list_cursor(created_at: float, workspace_id: str) -> str:
    """The cursor that resumes a listing after this workspace: its place in the listing order
    (creation time, then id), so it stays valid when the workspace itself is removed."""
    raw = f"{float(created_at)!r}\n{workspace_id}".encode()
    return _CURSOR_PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def parse_list_cursor(cursor: str) -> tuple[float, str]:
    """(created_at, workspace id) of a cursor; ValueError for anything `list_cursor` did not
    make (a clear `invalid_params`, never a silently empty or restarted listing)."""
    bad = ValueError("not a workspace.list cursor: pass the `next` of the previous answer")
    if not cursor.startswith(_CURSOR_PREFIX):
        raise bad
    body = cursor[len(_CURSOR_PREFIX) :]
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
