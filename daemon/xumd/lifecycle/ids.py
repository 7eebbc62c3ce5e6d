"""Ids and names: `prj_`/`ws_` plus 16 hex chars; a wrong prefix is `invalid_scope`."""

from __future__ import annotations

import re
import secrets

from xum_protocol.errors import ErrorKind
from xum_protocol.names import name_problem

from xumd.base.errors import XumError

PROJECT = "prj_"
WORKSPACE = "ws_"
_ID_RE = re.compile(r"([a-z]+_)([0-9a-f]{16})")


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(8)


def new_incarnation() -> str:
    return secrets.token_hex(16)


def check_id(value: str, prefix: str, what: str) -> str:
    """An id of the wrong kind is invalid_scope; a malformed one is simply not found."""
    if "_" in value and not value.startswith(prefix):  # another kind's prefix
        raise XumError(
            ErrorKind.INVALID_SCOPE,
            f"{value!r} is not a {what} id (a {what} id starts with {prefix!r})",
            id=value,
        )
    if not _ID_RE.fullmatch(value):
        raise XumError(ErrorKind.NOT_FOUND, f"{what} {value!r} not found", id=value)
    return value


def check_name(name: str, what: str = "workspace") -> str:
    """Every bad name is `invalid_name`: the params models leave the whole rule (NUL and
    length included) to this check, so it runs before anything uses the name."""
    problem = name_problem(name)
    if problem:
        # A name may be megabytes long (up to the frame cap): echo only its start.
        shown = name if len(name) <= 80 else f"{name[:64]}... ({len(name)} characters)"
        raise XumError(
            ErrorKind.INVALID_NAME, f"invalid {what} name {shown!r}: {problem}", name=shown
        )
    return name
