"""The feature graph: lifecycle, cleanup, processes, turns, usage, recovery and gc, installed in
dependency order (each line owned by its feature), and wired to the containment installed before
them. Installed before readiness, or at the first request of a lean start
(`xumd.startup.lazy_start`).

Every collaborator is a constructor argument, built here before what takes it; nothing is
assigned onto an object after it is built. Where two features need each other, the part of each
that the other needs is built first: recovery's reconciler (the lifecycle's failure guard and
`workspace.keep` settle rows with it) and the processes feature's supervision (the lifecycle's
quiescence check asks it) before the workspace service; the auto-archiver, which archives
through that service, after it. gc, built after the workspace service, serves the create's
`MakeRoom` port through a small request queue built before both (gc/room.py).
"""

from __future__ import annotations

from xumd.app import App
from xumd.checkouts.exclusion import DirectoryExclusion
from xumd.cleanup import feature as cleanup_feature
from xumd.gc import feature as gc_feature
from xumd.lifecycle import feature as lifecycle_feature
from xumd.lifecycle.hooks import LifecycleHooks
from xumd.processes import feature as processes_feature
from xumd.processes.leases import LeaseStore
from xumd.recovery import feature as recovery_feature
from xumd.system.containment import Containment
from xumd.system.git import Git
from xumd.turns import feature as turns_feature
from xumd.usage import feature as usage_feature


def lease_store(app: App) -> LeaseStore:
    """Built before the containment on a full start: its sweep adopts what a live lease names."""
    return processes_feature.leases(app)


def install(app: App, containment: Containment, *, leases: LeaseStore) -> None:
    # Shared by lifecycle, cleanup and processes, built here so none reaches into another:
    git = app.provide(Git(timeout_s=app.config.git_timeout_s, containment=containment))
    directories = app.provide(DirectoryExclusion(wait_s=app.config.lock_wait_s))
    scripts = app.provide(lifecycle_feature.scripts(app, leases=leases, containment=containment))
    snapshots = lifecycle_feature.snapshots(app, git)
    cleanup = cleanup_feature.install(  # cleanup obligations + retry
        app,
        git=git,
        directories=directories,
        scripts=scripts,
        unsaved=lifecycle_feature.archive_comparison(app, snapshots),
        teardown_env=lifecycle_feature.teardown_env(app),
        remember_cleanup=lifecycle_feature.remember_cleanup(app),
        records=lifecycle_feature.workspace_records(app),
    )
    reconciler = recovery_feature.reconciler(  # settles rows: the lifecycle's, built first
        app,
        git=git,
        announce=lifecycle_feature.announcer(app, cleanup),
        removals=cleanup,
        turns=turns_feature.settle_creating(app),
    )
    failures = lifecycle_feature.failure_guard(app, settle_row=reconciler.settle_row)
    coord = lifecycle_feature.coordinator(app, directories=directories, failures=failures)
    supervision = processes_feature.supervision(  # who holds a checkout: the lifecycle's
        app, admission=coord, leases=leases, containment=containment
    )
    hooks = app.provide(
        LifecycleHooks(processes=supervision.quiescence, rename_settler=reconciler.settle_journal)
    )
    room = gc_feature.room(app)  # a create asks gc for room through it: built before both
    workspaces = lifecycle_feature.install(  # projects, workspaces: uses cleanup
        app,
        coord=coord,
        failures=failures,
        git=git,
        scripts=scripts,
        snapshots=snapshots,
        cleanup=cleanup,
        hooks=hooks,
        room=room,
    )
    processes_feature.install(  # processes + leases + auto-archive
        app, supervision=supervision, leases=leases, hooks=hooks, archive=workspaces.archive
    )
    turns_feature.install(app, workspaces=workspaces, admission=coord)  # delegated turns
    usage = usage_feature.install(  # disk usage (after lifecycle and cleanup); built lazily
        app, git=git, reclaims=cleanup, pool=workspaces.pool
    )
    recovery_feature.install(  # startup pass + strays (last: runs after the others' hooks)
        app, reconciler=reconciler, git=git
    )
    gc_feature.install(  # gc policies (after usage and recovery: it uses both); built lazily
        app,
        git=git,
        hooks=hooks,
        usage=usage,
        workspaces=workspaces,
        reclaims=cleanup,
        room=room,
    )
