"""The JSON-RPC 2.0 specification's example methods (subtract, sum, update, notify_hello,
notify_sum, get_data), served only with `enable_test_methods`, so the spec's own examples can be
run verbatim against a real daemon; plus two test probes: `test.sleep` (a request that stays in
flight, for shutdown tests) and `test.fail` (an unexpected exception: -32603)."""

from __future__ import annotations

from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict, Field

from xumd.rpc.dispatch import RequestContext, Router


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    args: list[Any] = []

    @classmethod
    def from_positional(cls, raw: list[Any]) -> _Args:
        return cls(args=raw)


class _Numbers(BaseModel):
    model_config = ConfigDict(extra="forbid")
    args: list[float] = []

    @classmethod
    def from_positional(cls, raw: list[Any]) -> _Numbers:
        return cls.model_validate({"args": raw})


class _Subtract(BaseModel):
    model_config = ConfigDict(extra="forbid")
    minuend: float
    subtrahend: float

    @classmethod
    def from_positional(cls, raw: list[Any]) -> _Subtract:
        return cls.model_validate(dict(zip(("minuend", "subtrahend"), raw, strict=False)))


class _Bare(BaseModel):
    """The spec's examples return bare values; xum methods never do, so this one unwraps."""

    value: Any

    def model_dump(self, **kwargs: Any) -> Any:
        return self.value


class _Sleep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: float = Field(ge=0, le=3600)


class _Slept(BaseModel):
    slept: float


def _number(value: float) -> int | float:
    # Whole results print as integers (the spec's examples show 19, not 19.0) while exact.
    return int(value) if float(value).is_integer() and abs(value) <= 2**53 else value


def install(router: Router) -> None:
    async def subtract(p: _Subtract, ctx: RequestContext) -> BaseModel:
        return _Bare(value=_number(p.minuend - p.subtrahend))

    async def total(p: _Numbers, ctx: RequestContext) -> BaseModel:
        return _Bare(value=_number(sum(p.args)))

    async def nothing(p: _Args, ctx: RequestContext) -> BaseModel:
        return _Bare(value=None)

    async def get_data(p: _Args, ctx: RequestContext) -> BaseModel:
        return _Bare(value=["hello", 5])

    async def sleep(p: _Sleep, ctx: RequestContext) -> BaseModel:
        await anyio.sleep(p.seconds)
        return _Slept(slept=p.seconds)

    async def fail(p: _Args, ctx: RequestContext) -> BaseModel:
        raise RuntimeError("test.fail was asked to fail")

    router.add("subtract", subtract, _Subtract)
    router.add("sum", total, _Numbers)
    router.add("update", nothing, _Args)
    router.add("notify_hello", nothing, _Args)
    router.add("notify_sum", nothing, _Args)
    router.add("get_data", get_data, _Args)
    router.add("test.sleep", sleep, _Sleep)
    router.add("test.fail", fail, _Args)
