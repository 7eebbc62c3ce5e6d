"""The `data` of every event type, as typed models (the schema's typed events).

Each event type (`xum_protocol.event_types`) names one of these; the JSON Schema carries them, and
a discriminated union on `type` (`TYPED_EVENT`), so a client generated from the schema gets typed
events. Like results, they keep unknown fields: a 1.x server may add fields to an event's data.
A field that is not always present has a default (`None`): the docs mark it with `?`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from xum_protocol.models.base import Result
from xum_protocol.models.cleanup import Obligation
from xum_protocol.models.gc import GcBudget, GcSkipped
from xum_protocol.models.lease import LeaseInfo
from xum_protocol.models.process import ProcessInfo
from xum_protocol.models.project import ProjectInfo
from xum_protocol.models.turn import TurnInfo
from xum_protocol.models.workspace import AutoArchiveOutcome, WorkspaceInfo

WORKSPACE = "the workspace (`WorkspaceInfo`, as `workspace.get` answers)"
PROCESS = "the process (`ProcessInfo`, as `process.get` answers)"


class ProjectData(Result):
    project: ProjectInfo = Field(description="the project (`ProjectInfo`)")


class ProjectTrustedData(Result):
    project: ProjectInfo = Field(
        description="the project (`ProjectInfo`, with `trusted_config_hash`)"
    )


class ProjectRemovedData(Result):
    project_id: str = Field(description="its id")
    name: str = Field(description="its name")


class PoolRefilledData(Result):
    project_id: str = Field(description="the project whose warm pool gained an entry")
    entry_id: str = Field(description="the new entry's id (`pe_...`)")
    ready: int = Field(description="the project's ready entries now")


class WorkspaceData(Result):
    workspace: WorkspaceInfo = Field(description=WORKSPACE)


class WorkspaceStateChangedData(Result):
    workspace: WorkspaceInfo = Field(description=WORKSPACE)
    recovered: str | None = Field(
        default=None,
        description="the recovery pass's action (`completed`, `unarchive_rolled_back`, ...)",
    )


class WorkspaceRenamedData(Result):
    workspace: WorkspaceInfo = Field(description=WORKSPACE)
    previous_name: str = Field(description="the name before")


class WorkspaceInterruptedData(Result):
    workspace: WorkspaceInfo = Field(description=WORKSPACE)
    reason: str | None = Field(description="what was interrupted and what to do")


class WorkspaceRemovedData(Result):
    workspace_id: str = Field(description="its id")
    project_id: str | None = Field(default=None, description="its project (a removal)")
    name: str | None = Field(default=None, description="its name (a removal)")
    reason: str | None = Field(default=None, description="`create failed` (an undone create)")


class WorkspaceAutoArchiveData(Result):
    workspace_id: str = Field(description="the workspace")
    outcome: AutoArchiveOutcome = Field(description="`AutoArchiveOutcome` as a dict")


class _ScriptData(Result):
    workspace_id: str = Field(description="the workspace whose script runs")
    project_id: str = Field(description="its project")
    name: str = Field(description="the workspace's name")
    phase: Literal["setup"] = Field(
        description="`setup` (teardown runs in cleanup and is not streamed)"
    )
    index: int = Field(
        description="position of the command in the `[scripts]` list, from 1 (1..`count`)"
    )


class ScriptStartedData(_ScriptData):
    count: int = Field(description="how many commands the phase has")
    command: str = Field(description="the command text")


class ScriptPrintedData(_ScriptData):
    lines: list[str] = Field(description="the lines, decoded (invalid UTF-8 replaced)")


class ObligationData(Result):
    obligation: Obligation = Field(
        description="the obligation (`Obligation`, as `cleanup.list` answers)"
    )


class ProcessData(Result):
    process: ProcessInfo = Field(description=PROCESS)


class LeaseData(Result):
    lease: LeaseInfo = Field(description="the lease (`LeaseInfo`)")


class LeaseReleasedData(Result):
    lease: LeaseInfo = Field(description="the lease (`LeaseInfo`)")
    reason: str = Field(description="`released`, `holder gone`, ...")


class TurnData(Result):
    turn: TurnInfo = Field(description="the turn (`TurnInfo`)")


class GcEvictedData(Result):
    workspace_id: str = Field(description="the idle workspace a rebuildable directory left")
    path: str = Field(description="the directory moved to the trash")
    bytes: int = Field(description="its allocated bytes, as planned")
    obligation_id: str = Field(description="the reclaim that deletes it from the trash")


class GcBudgetExceededData(Result):
    budget: list[GcBudget] = Field(description="the parts of the disk budget exceeded")
    unmet_bytes: int = Field(description="what they still lack after every eviction possible")
    freed_bytes: int = Field(description="what the check's evictions freed")
    holders: list[GcSkipped] = Field(
        description="what was left and why (busy, in use, preserved, a mount)"
    )
