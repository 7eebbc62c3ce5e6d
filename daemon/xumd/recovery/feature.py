"""Install recovery: the startup pass (before readiness), `workspace.strays` (and
`workspace.discard_kept`, which deletes a kept copy of preserved files), and the
`daemon.status` details['recovery'] counts (interrupted workspaces, strays, last pass).

Installed after lifecycle, cleanup, processes and turns: its startup hook runs after theirs
(`processes.adopt` re-arms leases first; the cleanup retry service re-arms pending obligations
after readiness, including those this pass plans), and before the socket serves. Its
reconciler is built earlier (`reconciler`): the lifecycle takes its settlers at construction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.recovery import (
    WORKSPACE_DISCARD_KEPT,
    WORKSPACE_STRAYS,
    DiscardKeptParams,
    DiscardKeptResult,
    StraysParams,
    StraysResult,
)

from xumd.app import App
from xumd.base import logs
from xumd.base.errors import XumError
from xumd.lifecycle import dirstore, ids, preserved, rows
from xumd.lifecycle.context import require_project
from xumd.lifecycle.hooks import Holder, busy_message, mounts_holding
from xumd.recovery import strays
from xumd.recovery.reconcile import (
    Announce,
    Reconciler,
    RecoveryReport,
    RemovalPlans,
    SettleTurns,
)
from xumd.rpc.dispatch import RequestContext
from xumd.store.memo import StoreMemo
from xumd.system import fsdelete
from xumd.system.git import Git

STATUS_KEY = "recovery"

log = logs.get("xumd.recovery")


async def discard_kept_copy(app: App, path: str) -> DiscardKeptResult:
    """Delete exactly one kept copy: a direct child of ROOT/archive that no row claims
    (`strays.scan_kept`); never an archived workspace's own copy, never anything else.
    `workspace.discard_kept`, and gc's discard_kept policy (the same checks)."""
    given = Path(path)
    archive = app.paths.archive_store
    if not given.is_absolute() or given.parent != archive or given.name.startswith("."):
        raise XumError(
            ErrorKind.INVALID_PATH,
            f"{path!r} is not a kept copy: kept copies are directories in {archive} "
            "(see workspace.strays, kind 'kept')",
            path=path,
        )
    if not given.is_dir() or given.is_symlink():
        raise XumError(ErrorKind.NOT_FOUND, f"no kept copy at {path}", path=path)
    kept = {s.path: s for s in strays.scan_kept(app.store, app.paths)}
    if str(given) not in kept:
        raise XumError(
            ErrorKind.INVALID_STATE,
            f"{path} is the saved copy of workspace {given.name}, which still exists "
            "(unarchive restores it; removing the workspace makes it a kept copy)",
            path=path,
        )
    copy = preserved.load(given)
    files = len(copy.files) if copy is not None else 0
    # By descriptor and within one mount: a mount inside the copy is never emptied.
    # (An unreadable mount table holds it too: it cannot prove that no mount is inside.)
    holders = await mounts_holding(given)
    if not holders:
        left = await anyio.to_thread.run_sync(fsdelete.remove_tree, given)
        holders = [Holder("mount", None, f"mount at {m}") for m in left]
    if holders:
        raise XumError(
            ErrorKind.BUSY,
            f"kept copy {path} not (fully) discarded: {busy_message(holders)}; what is "
            "mounted inside is left alone: unmount it first",
            path=path,
            holders=[h.as_dict() for h in holders],
        )
    log.info("recovery.kept_discarded", path=str(given), files=files)
    return DiscardKeptResult(path=str(given), files=files)


def reconciler(
    app: App, *, git: Git, announce: Announce, removals: RemovalPlans, turns: SettleTurns
) -> Reconciler:
    """The reconciler: built by the composition root before the lifecycle, whose failure guard
    settles a failed operation's row with it (`settle_row`) and whose `workspace.keep` settles a
    kept rename journal (`settle_journal`)."""
    return app.provide(Reconciler(app, git, announce=announce, removals=removals, turns=turns))


def install(app: App, *, reconciler: Reconciler, git: Git) -> Reconciler:
    last: dict[str, Any] = {"report": RecoveryReport(), "strays": 0}

    async def startup() -> None:
        # Partial archive copies of a crashed daemon hold space and are never completed.
        dirstore.sweep_partial(app.paths.archive_store)
        last["report"] = await reconciler.run()
        last["strays"] = len(strays.scan(app.store, app.paths))

    async def list_strays(p: StraysParams, ctx: RequestContext) -> StraysResult:
        if p.project_id is not None:
            ids.check_id(p.project_id, ids.PROJECT, "project")
            require_project(app.store, p.project_id)
        found = strays.scan(app.store, app.paths, p.project_id)
        last["strays"] = len(found) if p.project_id is None else last["strays"]
        return StraysResult(strays=[await strays.describe(s, git, app.store) for s in found])

    async def discard_kept(p: DiscardKeptParams, ctx: RequestContext) -> DiscardKeptResult:
        return await discard_kept_copy(app, p.path)

    # Polled by monitors: the count is recomputed only when a row changed (or after a second).
    interrupted = StoreMemo(app.store, lambda: rows.count_interrupted(app.store))

    def status() -> dict[str, Any]:
        return {
            "interrupted": interrupted(),
            "strays": last["strays"],
            "last_pass": last["report"].as_dict(),
        }

    app.on_startup("recovery", startup)
    app.router.add(WORKSPACE_STRAYS, list_strays)
    app.router.add(WORKSPACE_DISCARD_KEPT, discard_kept)
    app.status_providers[STATUS_KEY] = status

    return reconciler
