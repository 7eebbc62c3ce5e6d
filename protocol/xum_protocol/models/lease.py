"""Protocol models of the `lease` domain: durable use leases on a workspace's checkout."""

from __future__ import annotations

from pydantic import Field

from xum_protocol.methods_base import MethodSpec
from xum_protocol.models.base import Label, Params, Result

LEASE_KIND_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"


class LeaseInfo(Result):
    id: str
    workspace_id: str
    kind: str = Field(description="agent, terminal, mcp, exec, setup, teardown, editor, ...")
    holder: str = Field(description="Who holds it: a process id (proc_...) or pid:<pid>:<start>.")
    pid: int | None
    pgid: int | None
    start_time: float | None
    label: str
    process_id: str | None = None
    live: bool
    created_at: float


class AcquireParams(Params):
    workspace_id: str = Field(min_length=1, max_length=64)
    kind: str = Field(pattern=LEASE_KIND_PATTERN, description="e.g. editor, terminal, tool")
    pid: int = Field(ge=1, le=2**31 - 1)
    label: Label = ""


class LeaseRef(Params):
    lease_id: str = Field(min_length=1, max_length=64)


class LeaseListParams(Params):
    workspace_id: str | None = None


class LeaseResult(Result):
    lease: LeaseInfo
    created: bool = Field(default=True, description="False: the same holder already had it.")


class LeaseListResult(Result):
    leases: list[LeaseInfo]
    reclaimed: list[str] = Field(default_factory=list, description="Dead holders' leases removed.")


class ReleaseResult(Result):
    released: str


LEASE_ACQUIRE = MethodSpec(
    "lease.acquire", AcquireParams, LeaseResult, "Register an external holder.", mutating=True
)
LEASE_RELEASE = MethodSpec(
    "lease.release", LeaseRef, ReleaseResult, "Remove a lease.", mutating=True
)
LEASE_LIST = MethodSpec(
    "lease.list", LeaseListParams, LeaseListResult, "Live leases (dead ones reclaimed)."
)
