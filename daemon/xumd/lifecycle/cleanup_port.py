"""How lifecycle reaches the cleanup service (issue 4) without importing its internals.

`CleanupPort` is the interface in docs (plan inside the caller's transaction, run now, status).
Until `xumd.cleanup.service.CleanupService` is installed, `InterimCleanup` performs the same
steps directly (teardown, fenced deletion of the checkout, git admin entry dropped): it is not
durable across a crash, which the real service is, and it never reports `completed` for a step
that did not complete.
"""

from __future__ import annotations

import importlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from xum_protocol.models.cleanup import CleanupStatus

from xumd import logs
from xumd.errors import XumError
from xumd.git import Git
from xumd.lifecycle import marker
from xumd.lifecycle.scripts import ScriptRunner
from xumd.lifecycle.seams import WorkspaceRef

log = logs.get("xumd.lifecycle.cleanup_port")


class CleanupPort(Protocol):
    def plan_checkout_removal(
        self,
        *,
        workspace_id: str,
        project_id: str,
        incarnation: str,
        runtime: str,
        repo_path: Path,
        checkout: Path,
        dev: int | None,
        ino: int | None,
        teardown: bool,
    ) -> list[str]: ...

    async def run_workspace(self, workspace_id: str, *, force: bool = False) -> CleanupStatus: ...

    def status(self, workspace_id: str) -> CleanupStatus | None: ...


def find_cleanup(app: Any) -> CleanupPort | None:
    try:
        module = importlib.import_module("xumd.cleanup.service")
    except ModuleNotFoundError:
        return None
    cls = getattr(module, "CleanupService", None)
    if cls is None:
        return None
    return cast("CleanupPort | None", app.find(cls))


@dataclass(slots=True)
class _Plan:
    workspace_id: str
    project_id: str
    name: str
    incarnation: str
    runtime: str
    repo_path: Path
    checkout: Path
    dev: int | None
    ino: int | None
    teardown: bool


class InterimCleanup:
    """Direct, non-durable cleanup used only while the cleanup service is not installed."""

    def __init__(self, git: Git, scripts: ScriptRunner) -> None:
        self.git = git
        self.scripts = scripts
        self._plans: dict[str, _Plan] = {}
        self._status: dict[str, CleanupStatus] = {}

    def plan_checkout_removal(
        self,
        *,
        workspace_id: str,
        project_id: str,
        incarnation: str,
        runtime: str,
        repo_path: Path,
        checkout: Path,
        dev: int | None,
        ino: int | None,
        teardown: bool,
    ) -> list[str]:
        self._plans[workspace_id] = _Plan(
            workspace_id,
            project_id,
            checkout.name,
            incarnation,
            runtime,
            repo_path,
            checkout,
            dev,
            ino,
            teardown,
        )
        self._status[workspace_id] = CleanupStatus(status="pending", next_attempt_at=time.time())
        return []

    def status(self, workspace_id: str) -> CleanupStatus | None:
        return self._status.get(workspace_id)

    async def run_workspace(self, workspace_id: str, *, force: bool = False) -> CleanupStatus:
        plan = self._plans.pop(workspace_id, None)
        if plan is None:
            return self._status.get(workspace_id) or CleanupStatus(status="not_needed")
        try:
            status = await self._run(plan)
        except XumError as exc:
            status = CleanupStatus(status="failed", attempts=1, last_error=exc.message)
        self._status[workspace_id] = status
        return status

    async def _run(self, plan: _Plan) -> CleanupStatus:
        path = plan.checkout
        if not os.path.lexists(path):
            if plan.runtime == "worktree":
                await self._drop_admin_entry(plan)
            return CleanupStatus(status="not_needed", reason="the checkout was already gone")
        found = marker.read_marker(path)
        st = path.lstat()
        if (
            found is None
            or found.workspace_id != plan.workspace_id
            or found.incarnation != plan.incarnation
            or (plan.ino is not None and (st.st_dev, st.st_ino) != (plan.dev, plan.ino))
        ):
            return CleanupStatus(
                status="failed",
                attempts=1,
                reason=f"{path} is not the checkout of {plan.workspace_id} ({plan.incarnation}); "
                "left alone",
            )
        errors: list[str] = []
        if plan.teardown:
            ref = WorkspaceRef(
                plan.workspace_id, plan.project_id, plan.name, path, plan.incarnation
            )
            outcome = await self.scripts.run(
                "teardown", project_id=plan.project_id, workspace=ref, cwd=path
            )
            if outcome.status in ("failed", "timeout"):
                errors.append(f"teardown {outcome.status}: {outcome.error}")
        if plan.runtime == "worktree":
            async with self.git.admin_lock(plan.repo_path):
                await self.git.run(
                    plan.repo_path,
                    "worktree",
                    "remove",
                    "--force",
                    "--force",
                    str(path),
                    what="git worktree remove",
                )
        else:
            shutil.rmtree(path)
        return CleanupStatus(status="completed", attempts=1, last_error="; ".join(errors) or None)

    async def _drop_admin_entry(self, plan: _Plan) -> None:
        async with self.git.admin_lock(plan.repo_path):
            await self.git.run(
                plan.repo_path,
                "worktree",
                "remove",
                "--force",
                "--force",
                str(plan.checkout),
                check=False,
            )
