"""The teardown step's default action: the project's teardown scripts.

The runner is the lifecycle's `ScriptRunner`, handed in by the composition root: cleanup names
only the shape it calls (`TeardownScripts`), so it imports nothing of the lifecycle feature.
Only a trusted config runs. An untrusted one blocks the deletion unless setup never ran under a
trusted config: then nothing of it needs tearing down (see `SETUP_NEVER_RAN`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Protocol

from xumd.checkouts.marker import WorkspaceRef
from xumd.cleanup import steps as steps_mod
from xumd.cleanup.obligations import ObligationRow
from xumd.cleanup.steps import Outcome

SETUP_NEVER_RAN = ("untrusted", "none", "pending", None)
"""Setup statuses under which no setup script of the project ever ran in the checkout."""


class ScriptResult(Protocol):
    @property
    def status(self) -> str: ...
    @property
    def output(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def hint(self) -> str | None: ...
    @property
    def leftovers(self) -> list[dict[str, Any]]: ...


class TeardownScripts(Protocol):
    """What cleanup calls to run a project's teardown scripts (lifecycle.scripts.ScriptRunner)."""

    async def run(
        self,
        phase: Literal["teardown"],
        *,
        project_id: str,
        workspace: WorkspaceRef,
        cwd: Path,
        kept_env: dict[str, str] | None = None,
    ) -> ScriptResult: ...


class ProjectTeardown:
    """A `TeardownFn` (steps.py) that runs the project's teardown scripts in the checkout."""

    def __init__(self, scripts: TeardownScripts | None) -> None:
        self.scripts = scripts

    async def __call__(self, ob: ObligationRow, cwd: Path) -> Outcome:
        if self.scripts is None:
            return Outcome.failed("no script runner is installed; teardown cannot run")
        ref = WorkspaceRef(
            id=ob.workspace_id,
            project_id=ob.project_id,
            name=str(ob.detail.get("name") or ob.workspace_id),
            path=cwd,
            incarnation=ob.incarnation,
        )
        kept = ob.detail.get("env")
        result = await self.scripts.run(
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
        if result.hint:
            error = f"{error} ({result.hint})"
        outcome = steps_mod.teardown_outcome(result.status, error, result.output or "")
        if result.leftovers:
            # What the teardown left running was stopped: said in the step's record (its
            # detail, shown by cleanup.list; its error when it failed), never silently.
            if outcome.state == "completed":
                outcome.detail["leftovers"] = result.leftovers
            elif outcome.state == "failed":
                said = describe_leftovers(result.leftovers)
                return Outcome.failed(f"{outcome.error}\n{said}" if outcome.error else said)
        return outcome


def describe_leftovers(leftovers: list[dict[str, Any]]) -> str:
    """One line naming what a teardown left running, which the daemon stopped."""
    shown = ", ".join(
        f"pid {e['pid']} ({' '.join(e.get('argv') or [])[:80]}, {e.get('signal')})"
        for e in leftovers[:5]
    )
    more = f" and {len(leftovers) - 5} more" if len(leftovers) > 5 else ""
    return f"stopped what the teardown left running: {shown}{more}"
