"""Base classes shared by every params/result model.

`defer_build`: a model's validator is built on first use, not at import. The daemon and the CLI
import every model of the protocol but use a few per run; building them all costs start-up time.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
"""ASCII control characters (NUL, newline, escape, DEL, ...)."""

Label = Annotated[
    str,
    Field(
        max_length=200,
        pattern=r"^[^\x00-\x1f\x7f]*$",
        description="Display text: no control characters (it is printed to terminals).",
    ),
]


Name = Annotated[
    str,
    Field(
        description="A project or workspace name: 1 to 64 characters, letters, digits, '.', '_' "
        "and '-', not starting with '.' or '-', no '..'. Any other string (empty, too long, "
        "with '/', NUL or control characters) is refused with `invalid_name`.",
    ),
]
"""A name field. Its rule is checked by the daemon (xum_protocol.names), not by the model, so that
every bad name is `invalid_name` (NUL and length included), never `invalid_params`; the daemon
checks it before anything uses it. List such fields in the model's `name_fields`."""


def _nul_in(value: Any, where: str) -> str | None:
    """Where a NUL character is inside `value` (strings, lists and dict keys/values)."""
    if isinstance(value, str):
        return where if "\0" in value else None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _nul_in(item, f"{where}[{index}]")
            if found:
                return found
    elif isinstance(value, dict):
        for key, item in value.items():
            found = _nul_in(key, f"{where} key {key!r}") or _nul_in(item, f"{where}[{key!r}]")
            if found:
                return found
    return None


NUL_FREE: Final = MappingProxyType({"nul_free": True})
"""Validation context for params decoded from JSON text known to hold no `\\u0000` escape
(xum_protocol.framing.nul_free): no string in them can hold a NUL, so the per-field scan is
skipped (it was most of the cost of validating params). Passed as `context=NUL_FREE`."""


class Params(BaseModel):
    """Request params: unknown fields are refused, so a typo is an error and not a silent no-op.

    No string of any params may carry a NUL character: every one of them may end up in an argv,
    an environment, a path or a log line, where a NUL is either impossible (the OS refuses it)
    or a truncation. Fields that are raw data (bytes for a terminal) opt out by name."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    nul_allowed: ClassVar[frozenset[str]] = frozenset()
    name_fields: ClassVar[frozenset[str]] = frozenset()
    """`Name` fields: the daemon refuses a NUL in them as `invalid_name` (names.py)."""

    @field_validator("*", mode="after")
    @classmethod
    def _refuse_nul(cls, value: Any, info: ValidationInfo) -> Any:
        if info.context is NUL_FREE:
            return value
        skip = cls.nul_allowed | cls.name_fields
        if isinstance(value, str | list | tuple | dict) and info.field_name not in skip:
            where = _nul_in(value, info.field_name or "value")
            if where:
                raise ValueError(f"{where} contains a NUL character")
        return value


class Result(BaseModel):
    """Results and events: extra fields are kept, so an older client reads a newer 1.x server."""

    model_config = ConfigDict(extra="allow", defer_build=True)
