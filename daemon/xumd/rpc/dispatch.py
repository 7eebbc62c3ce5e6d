"""Dispatch: handlers registered against their method's spec, typed (the pygls way).

The router knows nothing about sockets. It turns one decoded JSON-RPC message into at most one
response object, so the transport and the tests can drive it alike.

Nothing of pydantic or the protocol's models is imported here at load (a spec is a type here,
for the checker): a route's params model may be given as a loader (`params_from`), imported at
the route's first request, so that the daemon serves before loading them (docs/PERFORMANCE.md,
"Lean start").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from functools import cache, partial
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeGuard, TypeVar, cast, overload

import anyio
import orjson
from xum_protocol import request_keys
from xum_protocol.errors import ErrorKind, code_for
from xum_protocol.method_names import METHOD_NAMES, MUTATING

from xumd.base import logs, requestcut, requestkey
from xumd.base.errors import XumError
from xumd.rpc import requestkeys
from xumd.rpc.requestkeys import RequestKeys, Settle
from xumd.system import diskfull
from xumd.system.fdlimits import FD_ERRNOS, is_exhausted

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError
    from xum_protocol.methods_base import MethodSpec

log = logs.get("xumd.rpc")

RequestId = int | str | float | None


class Peer(Protocol):
    """What a handler may know of the connection that asked."""

    id: int
    pid: int | None
    uid: int | None
    protocol: str

    def notify(self, method: str, params: dict[str, Any]) -> bool: ...

    def on_close(self, callback: Callable[[], None]) -> None: ...

    def keep_streaming(self) -> None: ...


@dataclass(slots=True)
class RequestContext:
    peer: Peer
    method: str
    request_id: RequestId
    committed: Callable[[], BaseModel | None] | None = None
    """Set (through `requestcut.answer_if_cut`) once the request's logical change is
    committed: the result to answer should the rest of the request be cancelled (shutdown)."""


@dataclass(frozen=True, slots=True)
class Encoded:
    """A result its handler already holds as JSON bytes (an answer it keeps between calls,
    rebuilt only when what it shows changed): sent as it is, not serialised again."""

    json: bytes


Handler = Callable[[Any, RequestContext], Awaitable["BaseModel | Encoded"]]
P = TypeVar("P", bound="BaseModel")
R = TypeVar("R", bound="BaseModel")
ParamsLoader = Callable[[], "type[BaseModel]"]
LeanParams = Callable[[Any], Any]
"""The params of a request that are certainly valid, read without their model (a handler that
reads only what this returns), or None: the model decides (and words any refusal)."""
Builder = Callable[[str], Awaitable[None]]
"""Builds what registers a pending method's route (given the method's name, for errors and
logs); raises an `XumError` (internal) if it cannot."""


@dataclass(slots=True)
class _Route:
    params: type[BaseModel] | None
    """None: loaded at the first request by `params_from`, or the route is pending (`build`
    registers the real one)."""
    handler: Handler | None
    allowed_while_stopping: bool
    inline: bool = False
    build: Builder | None = None
    params_from: ParamsLoader | None = None
    lean_params: LeanParams | None = None
    mutating: bool = False
    """Its params may carry a `request_key` (`xum_protocol.method_names.MUTATING`)."""
    settle: Settle | None = None
    """Its answer for a keyed call a crash cut (`requestkeys.Settle`)."""


class _Later:
    def __repr__(self) -> str:
        return "LATER"


LATER: Final = _Later()
"""`Router.handle_now`: this message needs a task (its handler may await)."""


class InlineAwaited(RuntimeError):
    """A handler registered `inline` awaited: a bug in its registration, answered `internal`."""


def error_object(
    kind: ErrorKind, message: str, data: dict[str, Any] | None = None
) -> dict[str, Any]:
    payload: dict[str, Any] = {"kind": kind.value}
    if data:
        payload.update(data)
    return {"code": code_for(kind), "message": message, "data": payload}


def error_response(
    request_id: RequestId, kind: ErrorKind, message: str, data: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": error_object(kind, message, data)}


def _valid_id(value: Any) -> bool:
    # bool is an int subclass in Python, but not a JSON-RPC id.
    return value is None or (isinstance(value, int | float | str) and not isinstance(value, bool))


def expects_reply(message: Any) -> tuple[bool, RequestId]:
    """Whether `message` (one decoded batch item or frame) gets a response, and its id.

    Everything gets a response except a notification: a well-formed request without an `id`.
    Malformed messages are answered with `id: null`, as the specification says."""
    if not isinstance(message, dict):
        return True, None
    if "id" not in message:
        well_formed = (
            message.get("jsonrpc") == "2.0"
            and isinstance(message.get("method"), str)
            and ("params" not in message or isinstance(message.get("params"), dict | list))
        )
        return (not well_formed), None
    request_id = message.get("id")
    return True, request_id if _valid_id(request_id) else None


@cache
def _pydantic() -> tuple[type[ValidationError], Any, Callable[..., Any]]:
    """pydantic's ValidationError, the protocol's NUL-free validation context and
    `BaseModel.model_dump`: loaded at the first params validated (a route's model loads it)."""
    from pydantic import BaseModel, ValidationError
    from xum_protocol.models.base import NUL_FREE

    return ValidationError, NUL_FREE, BaseModel.model_dump


def _is_validation_error(exc: Exception) -> TypeGuard[ValidationError]:
    try:
        return isinstance(exc, _pydantic()[0])
    except Exception:  # pydantic could not even be imported: not a validation error
        return False


def _validation_errors(exc: ValidationError) -> list[dict[str, Any]]:
    # Keep what a client needs and drop input echoes (they may be huge or secret).
    return [
        {"loc": [str(part) for part in err["loc"]], "msg": err["msg"], "type": err["type"]}
        for err in exc.errors(include_url=False, include_input=False)[:20]
    ]


def _debug_enabled() -> bool:
    return bool(log.is_enabled_for(logging.DEBUG))


@dataclass
class Router:
    routes: dict[str, _Route] = field(default_factory=dict)
    stopping: Callable[[], bool] = lambda: False
    active: int = 0
    keys: RequestKeys | None = None
    """Where keyed calls are recorded (`rpc.requestkeys`); without it (a router without a store)
    a `request_key` is accepted and the call runs unkeyed."""
    log_requests: bool = field(default_factory=_debug_enabled)
    """Write a debug line per request: read once, when the router is made (after logging is
    configured); below debug, the line is not even built (it was a tenth of a status poll)."""
    _idle: anyio.Event | None = None

    async def wait_idle(self) -> None:
        """Return once no request is being handled (callers bound this with a deadline)."""
        while self.active:
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()

    @overload
    def add(
        self,
        method: MethodSpec[P, R],
        handler: Callable[[P, RequestContext], Awaitable[R | Encoded]],
        *,
        allowed_while_stopping: bool = False,
        inline: bool = False,
        settle: Callable[[P, str | None], R | None] | None = None,
    ) -> None: ...

    @overload
    def add(
        self,
        method: str,
        handler: Handler,
        params: type[BaseModel] | None = None,
        *,
        params_from: ParamsLoader | None = None,
        lean_params: LeanParams | None = None,
        allowed_while_stopping: bool = False,
        inline: bool = False,
    ) -> None: ...

    def add(
        self,
        method: MethodSpec[Any, Any] | str,
        handler: Handler,
        params: type[BaseModel] | None = None,
        *,
        params_from: ParamsLoader | None = None,
        lean_params: LeanParams | None = None,
        allowed_while_stopping: bool = False,
        inline: bool = False,
        settle: Settle | None = None,
    ) -> None:
        """Register `handler` for a method: a protocol method by its spec (the type checker
        checks the handler's params and result against it), or one outside the protocol's
        table by name with its params model (`params`). A protocol method by name is one
        that must answer before its model is loaded (the daemon's own): `params_from` is
        called at its first request for the model, and `lean_params` reads the raw params of
        a frame without a NUL escape, the common valid shapes only, so that it answers
        without loading the model at all (any other shape goes to it). `inline`: the handler
        never awaits (it reads memory and returns), so the transport may run it in its read
        callback, without a task; one that awaits all the same is stopped there and answered
        `internal`. `settle`: a mutating method's answer for a keyed call a crash cut
        (`requestkeys`); without it such a call is answered `operation_failed`."""
        if isinstance(method, str):
            name = method
            if params is None and params_from is None:
                raise RuntimeError(f"method {name} registered by name needs its params model")
            if params_from is None and name in METHOD_NAMES:
                raise RuntimeError(f"method {name} is the protocol's: register it by its spec")
        else:
            name, params = method.name, method.params
        known = self.routes.get(name)
        if known is not None and known.build is None:
            raise RuntimeError(f"method {name} registered twice")
        if params is not None:
            _pydantic()  # loaded with the model, not at a request
        self.routes[name] = _Route(
            params,
            handler,
            allowed_while_stopping,
            inline,
            params_from=params_from,
            lean_params=lean_params,
            mutating=name in MUTATING,
            settle=settle,
        )

    def add_pending(self, name: str, build: Builder) -> None:
        """Register `name` before its handler's module is loaded: its first request awaits
        `build`, which registers the real route (`add`), then goes on as any request (its
        params are validated then, with the same errors). `hello` lists it from the start. A
        pending method is refused while the daemon stops (nothing is built then)."""
        if name in self.routes:
            raise RuntimeError(f"method {name} registered twice")
        self.routes[name] = _Route(None, None, False, build=build)

    def pending(self) -> list[str]:
        """The methods whose routes are not built yet."""
        return [name for name, route in self.routes.items() if route.build is not None]

    @staticmethod
    def _envelope(message: Any) -> dict[str, Any] | tuple[bool, RequestId, str, Any]:
        """The envelope checks: an error response, or (has_id, id, method, params)."""
        if not isinstance(message, dict):
            return error_response(None, ErrorKind.INVALID_REQUEST, "a request must be an object")
        has_id = "id" in message
        request_id = message.get("id")
        if has_id and not _valid_id(request_id):
            return error_response(
                None, ErrorKind.INVALID_REQUEST, "id must be a string, a number or null"
            )
        method = message.get("method")
        params = message.get("params")
        if (
            message.get("jsonrpc") != "2.0"
            or not isinstance(method, str)
            or ("params" in message and not isinstance(params, dict | list))
        ):
            return error_response(
                request_id,
                ErrorKind.INVALID_REQUEST,
                "not a JSON-RPC 2.0 request: needs jsonrpc '2.0', a string method, "
                "and params that are an object or an array",
            )
        return has_id, request_id, method, params

    def _done(self) -> None:
        self.active -= 1
        if not self.active and self._idle is not None:
            self._idle.set()
            self._idle = None

    async def handle(
        self, message: Any, peer: Peer, *, fragments: bool = False, nul_free: bool = False
    ) -> dict[str, Any] | None:
        """Answer one (non-batch) message; None for a notification. With `fragments`, a
        result is serialised once, by its model, into an `orjson.Fragment` (for the transport,
        which encodes the envelope with orjson); else it is a plain dict. `nul_free`: the
        message was decoded from a frame that holds no NUL escape (framing.nul_free), so its
        params' strings need no NUL scan."""
        checked = self._envelope(message)
        if isinstance(checked, dict):
            return checked
        has_id, request_id, method, params = checked
        self.active += 1
        try:
            response = await self._call(
                method, params, peer, request_id, fragments=fragments, nul_free=nul_free
            )
        finally:
            self._done()
        return response if has_id else None

    def handle_now(
        self, message: Any, peer: Peer, *, nul_free: bool = False
    ) -> dict[str, Any] | _Later | None:
        """`handle` without awaiting, for what needs no task: envelope errors, unknown methods,
        refusals, bad params, and handlers registered `inline`; LATER for the rest (before
        anything else is done with the message, so the task path starts from scratch).

        This runs in the transport's read callback for every such request (`daemon.status`
        polls): it makes as few calls as it can, since each one costs a fraction of a
        microsecond with the caches cold. The checks are those of the task path."""
        checked = self._envelope(message)
        if isinstance(checked, dict):
            return checked
        has_id, request_id, method, raw_params = checked
        route = self.routes.get(method)
        if route is not None and not route.inline:
            return LATER
        # The daemon's own inline methods read their common params without a model
        # (`lean_params`, in the refusal checks); a model without fields is validated once
        # (`_empty_params`).
        params = self._refusal(route, method, raw_params, request_id, nul_free)
        if isinstance(params, dict):
            return params if has_id else None
        assert route is not None and route.handler is not None  # inline: built, with a handler
        self.active += 1
        # Only what the answer needs: the clock is read for the debug line alone, and the
        # request is not made current (`requestcut.current`): that is for `answer_if_cut`, and
        # a handler that runs to its end without awaiting cannot be cut.
        started = time.perf_counter() if self.log_requests else 0.0
        outcome = "ok"
        ctx = RequestContext(peer, method, request_id)
        response: dict[str, Any]
        try:
            coro = cast("Coroutine[Any, Any, BaseModel | Encoded]", route.handler(params, ctx))
            try:
                coro.send(None)
            except StopIteration as finished:
                result = finished.value
                response = (
                    {"jsonrpc": "2.0", "id": request_id, "result": orjson.Fragment(result.json)}
                    if type(result) is Encoded
                    else _success(request_id, result, fragments=True)
                )
            else:
                # It awaited: without a task it cannot go on. Stop it there (its `finally`
                # blocks run) and say so; the registration is the bug.
                coro.close()
                raise InlineAwaited(f"inline handler for {method} awaited")
        except Exception as exc:
            response, outcome = _failure(exc, method, request_id)
        finally:
            self._done()
            if self.log_requests:
                _log_request(ctx, started, outcome, inline=True)
        return response if has_id else None

    def _refusal(
        self,
        route: _Route | None,
        method: str,
        raw_params: Any,
        request_id: RequestId,
        nul_free: bool = False,
    ) -> dict[str, Any] | BaseModel:
        """An error response (no route, stopping, bad params), or the validated params."""
        if route is None:
            return error_response(
                request_id, ErrorKind.METHOD_NOT_FOUND, f"method {method!r} not found"
            )
        if self.stopping() and not route.allowed_while_stopping:
            return error_response(
                request_id, ErrorKind.SHUTTING_DOWN, "the daemon is shutting down"
            )
        if route.params is None and route.params_from is None:
            # Its build ran and did not register it: a bug in the method table.
            log.error("rpc.pending_route_not_built", method=method)
            message = f"internal error in {method}; see the daemon log"
            return error_response(request_id, ErrorKind.INTERNAL, message)
        if nul_free and route.lean_params is not None:
            lean = route.lean_params(raw_params)
            if lean is not None:
                return cast("BaseModel", lean)
        try:
            if route.params is None:
                assert route.params_from is not None
                model = route.params_from()  # its first request: the model's import
                _pydantic()
                route.params = model
            return self._parse_params(route.params, raw_params, nul_free)
        except Exception as exc:
            if not _is_validation_error(exc):
                # Loading or building the model failed (a model built at its first use
                # imports more of pydantic: out of descriptors, that fails): said as any
                # handler's failure; the next request tries again.
                return _failure(exc, method, request_id)[0]
            return error_response(
                request_id,
                ErrorKind.INVALID_PARAMS,
                f"invalid params for {method}: {exc.error_count()} problem(s)",
                {"errors": _validation_errors(exc)},
            )

    async def _call(
        self,
        method: str,
        raw_params: Any,
        peer: Peer,
        request_id: RequestId,
        *,
        fragments: bool = False,
        nul_free: bool = False,
    ) -> dict[str, Any]:
        route = self.routes.get(method)
        if route is not None and route.build is not None and not self.stopping():
            try:
                await route.build(method)
            except XumError as exc:
                return error_response(request_id, exc.kind, exc.message, exc.data)
            route = self.routes.get(method)
        key: Any = None
        if (
            route is not None
            and route.mutating
            and isinstance(raw_params, dict)
            and request_keys.FIELD in raw_params
        ):
            # The transport's, not the handler's: taken out before the params model sees them.
            key = raw_params[request_keys.FIELD]
            raw_params = {k: v for k, v in raw_params.items() if k != request_keys.FIELD}
            problem = request_keys.problem(key)
            if problem is not None:
                return error_response(request_id, ErrorKind.INVALID_PARAMS, problem)
        params = self._refusal(route, method, raw_params, request_id, nul_free)
        if isinstance(params, dict):
            return params
        assert route is not None and route.handler is not None
        if key is not None and self.keys is not None:
            return await self._keyed(
                route,
                method,
                params,
                key,
                keys=self.keys,
                peer=peer,
                request_id=request_id,
                fragments=fragments,
            )
        return await self._run(route, method, params, peer, request_id, fragments=fragments)

    async def _keyed(
        self,
        route: _Route,
        method: str,
        params: BaseModel,
        key: str,
        *,
        keys: RequestKeys,
        peer: Peer,
        request_id: RequestId,
        fragments: bool,
    ) -> dict[str, Any]:
        """A call named by a request key: answered from its record, after the first call
        running now, or run once (`rpc.requestkeys`)."""
        digest = requestkeys.params_hash(params)
        while True:
            running = keys.running.get(key)
            if running is not None:
                if running.method != method or running.params_hash != digest:
                    exc = keys.different(key, method, running.method, running.started_at)
                    return _failure(exc, method, request_id)[0]
                # Bounded by the first call's own deadlines; this request's client has its own.
                log.info("rpc.request_key_waiting", method=method, conn=peer.id)
                await running.done.wait()
                if running.response is not None:
                    return {**running.response, "id": request_id}
                continue  # cancelled with nothing done: the key is free again
            first = keys.recorded(key)
            if first is None:
                break
            if first.method != method or first.params_hash != digest:
                exc = keys.different(key, method, first.method, first.created_at)
                return _failure(exc, method, request_id)[0]
            if first.result is not None:
                log.info("rpc.request_key_answered", method=method, conn=peer.id)
                return _recorded(request_id, first.result, fragments)
            if route.settle is None:
                return _failure(keys.cut(key, first), method, request_id)[0]
            try:
                settled = route.settle(params, first.target)
            except Exception as exc:
                return _failure(exc, method, request_id)[0]
            if settled is None:
                log.info("rpc.request_key_rerun", method=method, conn=peer.id)
                break  # the cut call left nothing: it runs now (its record is replaced)
            body = orjson.dumps(settled.model_dump(mode="json"))
            keys.settled(key, body)
            log.info("rpc.request_key_settled", method=method, conn=peer.id)
            return _recorded(request_id, body, fragments)
        try:
            running = keys.start(key, method, digest, durable=route.settle is None)
        except XumError as exc:  # the record cannot be written (a full disk): nothing ran
            return _failure(exc, method, request_id)[0]
        response: dict[str, Any] | None = None
        token = requestkey.current.set(
            requestkey.KeyedCall(method, partial(keys.bind, key, running))
        )
        try:
            response = await self._run(route, method, params, peer, request_id, fragments=False)
            return response
        finally:
            requestkey.current.reset(token)
            try:
                if response is not None and "result" in response:
                    keys.answered(key, running, orjson.dumps(response["result"]))
                elif response is None or route.settle is None:
                    keys.release(key)  # cancelled before anything committed, or an error
                # else an error where a settler can read the disk: the record stays unanswered,
                # so a repeat answers what the disk shows (an error after the commit is no
                # reason to do the operation twice)
            except XumError as exc:
                # The answer stands; only its record could not be written (a full disk). A
                # repeat then finds the record unanswered, as after a crash: it settles from
                # the disk where the method can, else it is told the outcome is unknown.
                log.warning("rpc.request_key_not_recorded", method=method, error=exc.message)
            finally:
                keys.finish(key, running, response)

    async def _run(
        self,
        route: _Route,
        method: str,
        params: BaseModel,
        peer: Peer,
        request_id: RequestId,
        *,
        fragments: bool,
    ) -> dict[str, Any]:
        assert route.handler is not None
        started = time.perf_counter()
        outcome = "ok"
        ctx = RequestContext(peer, method, request_id)
        token = requestcut.current.set(ctx)
        try:
            result = await route.handler(params, ctx)
            return _success(request_id, result, fragments=fragments)
        except anyio.get_cancelled_exc_class():
            if ctx.committed is None:
                outcome = "cancelled"
                raise  # nothing committed: the connection answers `shutting_down`
            # The change went through: answer it as it is now (its physical part pending),
            # never as cancelled. The cancellation ends here; the caller's next await sees the
            # still-cancelled scope again (the connection queues this answer without waiting).
            late = ctx.committed()
            if late is None:
                outcome = "cancelled"
                raise
            outcome = "cut_short"
            log.info("rpc.answered_after_cut", method=method, conn=peer.id)
            return {"jsonrpc": "2.0", "id": request_id, "result": late.model_dump(mode="json")}
        except Exception as exc:
            response, outcome = _failure(exc, method, request_id)
            return response
        finally:
            requestcut.current.reset(token)
            if self.log_requests:
                _log_request(ctx, started, outcome)

    @staticmethod
    def _parse_params(model: type[BaseModel], raw: Any, nul_free: bool = False) -> BaseModel:
        if not raw:
            # No params for a model without fields (`daemon.status`, polled): the one valid
            # instance, validated once. It holds nothing, so requests cannot share state in it.
            empty = _empty_params(model)
            if empty is not None:
                return empty
        if raw is None:
            raw = {}
        if isinstance(raw, list) and hasattr(model, "from_positional"):
            return model.from_positional(raw)  # type: ignore[no-any-return]
        if isinstance(raw, list):
            # By-position params map onto the model's fields in declaration order.
            names = list(model.model_fields)
            if len(raw) > len(names):
                raw = {**dict(zip(names, raw, strict=False)), "__extra_positional__": raw}
            else:
                raw = dict(zip(names, raw, strict=False))
        return model.model_validate(raw, context=_pydantic()[1] if nul_free else None)


_EMPTY: dict[type[BaseModel], BaseModel | None] = {}


def _empty_params(model: type[BaseModel]) -> BaseModel | None:
    """`model` validated from no params, once per model; None for a model with fields (each
    request gets its own instance). Looked up in a dict: `model_fields` costs a third of a µs.
    A model that refuses empty params raises every time (only a success is kept)."""
    try:
        return _EMPTY[model]
    except KeyError:
        pass
    made = None if model.model_fields else model.model_validate({})
    _EMPTY[model] = made
    return made


def _log_request(
    ctx: RequestContext, started: float, outcome: str, *, inline: bool = False
) -> None:
    """The debug line at the end of a handler's run, inline or in a task."""
    log.debug(
        "rpc.request",
        method=ctx.method,
        duration_ms=round((time.perf_counter() - started) * 1000, 3),
        outcome=outcome,
        conn=ctx.peer.id,
        **({"inline": True} if inline else {}),
    )


def _recorded(request_id: RequestId, result: bytes, fragments: bool) -> dict[str, Any]:
    """A keyed call's recorded result, answered as it was."""
    body = orjson.Fragment(result) if fragments else orjson.loads(result)
    return {"jsonrpc": "2.0", "id": request_id, "result": body}


def _success(
    request_id: RequestId, result: BaseModel | Encoded, *, fragments: bool
) -> dict[str, Any]:
    if isinstance(result, Encoded):
        body: Any = orjson.Fragment(result.json) if fragments else orjson.loads(result.json)
    elif fragments and type(result).model_dump is _pydantic()[2]:
        # Serialised once, by the model's own (Rust) serialiser, straight to JSON bytes that
        # orjson splices into the envelope: no intermediate dict.
        body = orjson.Fragment(result.__pydantic_serializer__.to_json(result))
    else:
        # A model that shapes its own output (overrides model_dump) is asked for it.
        body = result.model_dump(mode="json")
    return {"jsonrpc": "2.0", "id": request_id, "result": body}


def _failure(exc: Exception, method: str, request_id: RequestId) -> tuple[dict[str, Any], str]:
    """The error response for a handler's exception, and the outcome to log."""
    if isinstance(exc, XumError):
        if exc.kind is ErrorKind.DISK_FULL:
            log.warning("rpc.disk_full", method=method, filesystem=exc.data.get("filesystem"))
        return error_response(request_id, exc.kind, exc.message, exc.data), exc.kind.value
    if isinstance(exc, OSError) and is_exhausted(exc):
        # Out of descriptors (a git spawn, a pipe, a PTY, the store): transient, and the
        # durable write order leaves nothing half-applied that recovery would not settle.
        resource = "file_descriptors" if exc.errno in FD_ERRNOS else "memory"
        log.warning("rpc.resource_exhausted", method=method, resource=resource)
        return error_response(
            request_id,
            ErrorKind.OPERATION_FAILED,
            f"{method} failed: the daemon is out of {resource.replace('_', ' ')} "
            f"({exc.strerror}); retry later",
            {"resource": resource},
        ), "exhausted"
    known = diskfull.from_exception(exc)
    if known is not None:
        # A write the handler did not expect to fail (a full disk, a read-only one) is the
        # machine's answer, not a bug: named as such (its own cleanup ran as the error passed).
        log.warning(
            "rpc.filesystem_refused",
            method=method,
            kind=known.kind.value,
            filesystem=known.data.get("filesystem"),
        )
        return error_response(request_id, known.kind, known.message, known.data), known.kind.value
    log.exception("rpc.internal_error", method=method)
    return error_response(
        request_id, ErrorKind.INTERNAL, f"internal error in {method}; see the daemon log"
    ), "internal"
