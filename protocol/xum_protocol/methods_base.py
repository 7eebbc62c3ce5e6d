"""The shape of one method-table entry: a method's name, its params and result models, typed.

A handler is registered against its method's spec (`Router.add(spec, handler)` in the daemon),
so the type checker checks the handler's params and result against the spec's models (pygls's
way with lsprotocol's method types). Nothing of pydantic is imported here at run time: the
daemon's dispatch names this type without loading the models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from pydantic import BaseModel

P = TypeVar("P", bound="BaseModel")
R = TypeVar("R", bound="BaseModel")


@dataclass(frozen=True, slots=True)
class MethodSpec(Generic[P, R]):
    """One method: declared once, as a module constant of its domain's models named after it
    (`workspace.create`: `WORKSPACE_CREATE`); `xum_protocol.methods.METHODS` gathers them."""

    name: str
    params: type[P]
    result: type[R]
    summary: str
    mutating: bool = False
    """It changes what the daemon holds (a row, a checkout, a process, a lease): its params
    accept a `request_key` (`xum_protocol.request_keys`), so a repeat after a lost answer is
    answered the first call's outcome instead of doing it twice. Reads are not."""
