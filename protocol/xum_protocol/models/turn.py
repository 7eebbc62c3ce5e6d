"""Protocol models of the `turn` domain: delegated workspace turns.

A turn (handle `turn_<hex>`) is created only by the daemon. It binds an owner workspace to a target
workspace: `mode: "new"` creates the target (the binding is committed with the target's intent
row), `mode: "existing"` reuses a target the owner is already bound to. A client can never forge
the binding: `workspace.create` takes no handle or owner.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from xum_protocol.methods_base import MethodSpec
from xum_protocol.models.base import Name, Params, Result
from xum_protocol.models.workspace import Runtime, ScriptResult, WorkspaceInfo

TurnState = Literal["creating", "open", "ended", "failed"]


class TurnInfo(Result):
    id: str
    owner_workspace_id: str
    target_workspace_id: str | None
    mode: Literal["new", "existing"]
    state: TurnState
    reason: str | None = Field(default=None, description="Why `failed`.")
    target_interrupted: bool = Field(
        default=False, description="The target's creation was interrupted (keep or remove it)."
    )
    created_at: float
    updated_at: float
    ended_at: float | None = None


class TurnCreateParams(Params):
    name_fields: ClassVar[frozenset[str]] = frozenset({"name"})

    owner_workspace_id: str = Field(min_length=1, max_length=200)
    # A plain string, not a Literal: an unknown mode is `invalid_scope`, as the contract says.
    mode: str = Field(min_length=1, max_length=32)
    name: Name | None = None
    base: str | None = Field(default=None, min_length=1, max_length=250)
    runtime: Runtime | None = Field(
        default=None,
        description="Mode new: the target's runtime (`worktree` or `directory`); by default the "
        "owner's. A plain-directory project takes `directory` only.",
    )
    target_workspace_id: str | None = Field(default=None, min_length=1, max_length=200)


class TurnCreateResult(Result):
    turn: TurnInfo
    workspace: WorkspaceInfo
    setup: ScriptResult | None = Field(
        default=None, description="Setup of a new target (mode new); none for mode existing."
    )


class TurnIdParams(Params):
    handle_id: str = Field(min_length=1, max_length=200)


class TurnResult(Result):
    turn: TurnInfo


class TurnListParams(Params):
    owner_workspace_id: str = Field(min_length=1, max_length=200)


class TurnListResult(Result):
    turns: list[TurnInfo]


TURN_CREATE = MethodSpec(
    "turn.create",
    TurnCreateParams,
    TurnCreateResult,
    "Delegate to a new target workspace (mode new) or one the owner is bound to (existing).",
    mutating=True,
)
TURN_GET = MethodSpec("turn.get", TurnIdParams, TurnResult, "One delegated turn.")
TURN_LIST = MethodSpec(
    "turn.list", TurnListParams, TurnListResult, "The turns of an owner workspace."
)
TURN_END = MethodSpec(
    "turn.end",
    TurnIdParams,
    TurnResult,
    "End a turn (the target workspace is not touched).",
    mutating=True,
)
