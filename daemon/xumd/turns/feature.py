"""Install delegated turns: the service and the `turn.*` handlers."""

from __future__ import annotations

from xum_protocol.models.turn import (
    TURN_CREATE,
    TURN_END,
    TURN_GET,
    TURN_LIST,
    TurnCreateParams,
    TurnCreateResult,
    TurnIdParams,
    TurnListParams,
    TurnListResult,
    TurnResult,
)

from xumd.app import App
from xumd.rpc.dispatch import RequestContext
from xumd.turns import service
from xumd.turns.service import Admission, Targets, TurnService, turn_info


def settle_creating(app: App) -> service.Reconcile:
    """Recovery's pass settles turns left `creating` in its transaction: rows only."""
    return lambda: service.reconcile(app.store)


def install(app: App, *, workspaces: Targets, admission: Admission) -> TurnService:
    turns = app.provide(TurnService(app, workspaces, admission))

    async def create(p: TurnCreateParams, ctx: RequestContext) -> TurnCreateResult:
        return await turns.create(p)

    async def get(p: TurnIdParams, ctx: RequestContext) -> TurnResult:
        return TurnResult(turn=turn_info(turns.get(p.handle_id)))

    async def list_(p: TurnListParams, ctx: RequestContext) -> TurnListResult:
        return TurnListResult(turns=[turn_info(t) for t in turns.list_for(p.owner_workspace_id)])

    async def end(p: TurnIdParams, ctx: RequestContext) -> TurnResult:
        return TurnResult(turn=turn_info(turns.end(p.handle_id)))

    app.router.add(TURN_CREATE, create)
    app.router.add(TURN_GET, get)
    app.router.add(TURN_LIST, list_)
    app.router.add(TURN_END, end)
    return turns
