"""Install recovery: the startup pass (before readiness), `workspace.strays`, and the
`daemon.status` details['recovery'] counts (interrupted workspaces, strays, last pass).

Installed after lifecycle, cleanup, processes and turns: its startup hook runs after theirs
(`processes.adopt` re-arms leases first; the cleanup retry service re-arms pending obligations
after readiness, including those this pass plans), and before the socket serves.
"""

from __future__ import annotations

from typing import Any

from xum_protocol.models.recovery import StraysParams, StraysResult

from xumd.app import App
from xumd.git import Git
from xumd.lifecycle import dirstore, ids
from xumd.lifecycle.seams import LifecycleHooks
from xumd.lifecycle.service import WorkspaceService
from xumd.recovery import strays
from xumd.recovery.reconcile import Reconciler, RecoveryReport
from xumd.rpc.dispatch import RequestContext
from xumd.store.memo import StoreMemo
from xumd.turns.service import TurnService

STATUS_KEY = "recovery"


def install(app: App) -> Reconciler:
    workspaces = app.get(WorkspaceService)
    git = app.find(Git) or app.provide(Git(timeout_s=app.config.git_timeout_s))
    reconciler = app.provide(Reconciler(app, workspaces, git, app.find(TurnService)))
    last: dict[str, Any] = {"report": RecoveryReport(), "strays": 0}

    async def startup() -> None:
        # Partial archive copies of a crashed daemon hold space and are never completed.
        dirstore.sweep_partial(app.paths.archive_store)
        last["report"] = await reconciler.run()
        last["strays"] = len(strays.scan(app.store, app.paths))

    async def list_strays(p: StraysParams, ctx: RequestContext) -> StraysResult:
        if p.project_id is not None:
            ids.check_id(p.project_id, ids.PROJECT, "project")
            workspaces.project(p.project_id)
        found = strays.scan(app.store, app.paths, p.project_id)
        last["strays"] = len(found) if p.project_id is None else last["strays"]
        return StraysResult(strays=[await strays.describe(s, git, app.store) for s in found])

    def count_interrupted() -> int:
        found = app.store.one("SELECT COUNT(*) AS n FROM workspaces WHERE interrupted = 1")
        return int(found["n"]) if found else 0

    # Polled by monitors: the count is recomputed only when a row changed (or after a second).
    interrupted = StoreMemo(app.store, count_interrupted)

    def status() -> dict[str, Any]:
        return {
            "interrupted": interrupted(),
            "strays": last["strays"],
            "last_pass": last["report"].as_dict(),
        }

    # workspace.keep settles a kept rename journal with the startup pass's own logic.
    app.get(LifecycleHooks).rename_settler = reconciler.settle_journal
    # An operation that failed part-way leaves its row as the startup pass would.
    app.get(LifecycleHooks).row_settler = reconciler.settle_row
    app.on_startup("recovery", startup)
    app.router.add("workspace.strays", list_strays)
    app.status_providers[STATUS_KEY] = status

    return reconciler
