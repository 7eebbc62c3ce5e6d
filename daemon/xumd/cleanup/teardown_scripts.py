"""The teardown step's default action: the project's teardown scripts (lifecycle's ScriptRunner).

Only a trusted config runs. An untrusted one blocks the deletion unless setup never ran under a
trusted config: then nothing of it needs tearing down (see `SETUP_NEVER_RAN`).
"""

from __future__ import annotations

from pathlib import Path

from xumd.app import App
from xumd.cleanup import steps as steps_mod
from xumd.cleanup.lifecycle_link import lifecycle_service
from xumd.cleanup.obligations import ObligationRow
from xumd.cleanup.steps import Outcome
from xumd.lifecycle.seams import WorkspaceRef

SETUP_NEVER_RAN = ("untrusted", "none", "pending", None)
"""Setup statuses under which no setup script of the project ever ran in the checkout."""


class ProjectTeardown:
    """A `TeardownFn` (steps.py) that runs the project's teardown scripts in the checkout."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, ob: ObligationRow, cwd: Path) -> Outcome:
        runner = lifecycle_service(self.app, "xumd.lifecycle.scripts", "ScriptRunner")
        if runner is None:
            return Outcome.failed("no script runner is installed; teardown cannot run")
        ref = WorkspaceRef(
            id=ob.workspace_id,
            project_id=ob.project_id,
            name=str(ob.detail.get("name") or ob.workspace_id),
            path=cwd,
            incarnation=ob.incarnation,
        )
        kept = ob.detail.get("env")
        result = await runner.run(
            "teardown",
            project_id=ob.project_id,
            workspace=ref,
            cwd=cwd,
            kept_env=kept if isinstance(kept, dict) else None,
        )
        if result.status == "untrusted" and ob.detail.get("setup_status") in SETUP_NEVER_RAN:
            # Setup never ran under a trusted config, so nothing of it needs tearing down:
            # blocking the deletion on a script the user never allowed would keep the checkout
            # forever. A config trusted at setup time and changed since still blocks (fail
            # closed): that setup's teardown is owed.
            return Outcome.done(
                teardown="skipped",
                reason="teardown not run: the project's config is not trusted and setup never "
                "ran under it",
            )
        error = result.error
        if getattr(result, "hint", None):
            error = f"{error} ({result.hint})"
        return steps_mod.teardown_outcome(result.status, error, result.output or "")
