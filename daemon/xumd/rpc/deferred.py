"""A feature's service built at its first request, not before readiness.

Time to ready is almost all imports (docs/PERFORMANCE.md, "Start-up"). A feature that
no startup step needs (gc, disk usage) registers its routes at start against the protocol's
method specs, as every route (so bad params are refused without loading its service),
and imports and builds its service only when a request first names one of them.

The build is synchronous and runs on the event loop's thread: nothing can interleave between the
check and the store of the built value, so two first requests arriving together build it once
(the loop is the lock). A build that fails (an import error, a missing file, a bad install) is
logged and answered as an `internal` error naming the feature; the daemon keeps serving, and the
next request tries again (Python drops a module whose import failed, so a retry re-imports it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import anyio
from pydantic import BaseModel
from xum_protocol.errors import ErrorKind

from xumd.base import faults, logs
from xumd.base.errors import XumError
from xumd.rpc.dispatch import RequestContext

log = logs.get("xumd.rpc")

T = TypeVar("T")
P = TypeVar("P", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)

BUILD_FAILS = faults.declare(
    "rpc.deferred_build_fails",
    "simulate: the first build of a deferred feature in this daemon fails as a failed import "
    "would (answered internal; the next request builds it)",
    simulate=True,
)
_fault_spent = False


class Deferred(Generic[T]):
    """The service of feature `feature`, built by `build` at its first use."""

    def __init__(self, feature: str, build: Callable[[], T]) -> None:
        self.feature = feature
        self._build = build
        self._value: T | None = None
        self._built = anyio.Event()

    @property
    def built(self) -> T | None:
        return self._value

    def get(self, why: str) -> T:
        """The service, built now if it is not yet; `why` names the caller (a method) for the
        error and the log."""
        global _fault_spent
        if self._value is not None:
            return self._value
        try:
            if BUILD_FAILS.active and not _fault_spent:
                _fault_spent = True
                raise ImportError(f"simulated: {self.feature} failed to load")
            value = self._build()
        except Exception as exc:
            log.exception("rpc.feature_load_failed", feature=self.feature, caller=why)
            raise XumError(
                ErrorKind.INTERNAL,
                f"{why} is unavailable: the {self.feature} feature failed to load "
                f"({type(exc).__name__}); see the daemon log",
                feature=self.feature,
            ) from exc
        self._value = value
        self._built.set()
        log.info("rpc.feature_loaded", feature=self.feature, caller=why)
        return value

    async def wait(self) -> T:
        """The service once someone built it (a background worker with nothing to do until a
        request needs the feature). Callers bound it: the daemon's shutdown cancels it."""
        await self._built.wait()
        assert self._value is not None
        return self._value

    def route(
        self, handler: Callable[[T, P, RequestContext], Awaitable[R]]
    ) -> Callable[[P, RequestContext], Awaitable[R]]:
        """A route handler that builds the service at the first call, then hands it over."""

        async def call(params: P, ctx: RequestContext) -> R:
            return await handler(self.get(ctx.method), params, ctx)

        return call
