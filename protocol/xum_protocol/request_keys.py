"""Request keys: what makes a retried mutating call safe (docs/PROTOCOL.md, "Request keys").

A client names a mutating call (`MethodSpec.mutating`) with `request_key`, a string it chose,
in the call's params. The daemon records the key with the call's outcome; a repeat with the same
key and the same params is answered that outcome (or waits for the first while it runs) without
doing it again. Plain values only: the daemon's transport reads them without loading pydantic.
"""

from __future__ import annotations

import re
from typing import Any, Final

FIELD: Final = "request_key"
"""The params field that carries the key (beside the method's own params)."""

MAX_LENGTH: Final = 128
PATTERN: Final = r"^[A-Za-z0-9._:-]{1,128}$"
"""Letters, digits and `._:-`: a uuid4, a ulid, `agent-7:step-3` all fit; nothing to escape
in a log line or a message."""

TTL_S: Final = 24 * 3600
"""How long the daemon keeps a key's record after its call was made: a repeat within it is
answered the first outcome; after it the key is forgotten (a repeat runs the call again)."""

_VALID = re.compile(PATTERN)


def problem(value: Any) -> str | None:
    """Why `value` is not a request key, or None when it is one."""
    if not isinstance(value, str):
        return "request_key must be a string"
    if not _VALID.match(value):
        return f"request_key must be 1 to {MAX_LENGTH} characters of letters, digits and '._:-'"
    return None


def json_schema() -> dict[str, Any]:
    """The field's schema, added to every mutating method's params (`make schema`)."""
    return {
        "type": "string",
        "pattern": PATTERN,
        "maxLength": MAX_LENGTH,
        "title": "Request Key",
        "description": (
            "Names this call for a safe retry: a repeat with the same key and params within "
            f"{TTL_S // 3600} h answers the first call's outcome (waiting for it while it runs) "
            "instead of doing it again; the same key with other params is `invalid_params`."
        ),
    }
