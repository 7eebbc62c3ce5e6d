"""The feature graph: lifecycle, cleanup, processes, turns, usage, recovery and gc, installed in
dependency order (each line owned by its feature), and wired to the containment installed before
them. Installed before readiness, or at the first request of a lean start
(`xumd.startup.lazy_start`)."""

from __future__ import annotations

from xumd.app import App
from xumd.checkouts.exclusion import DirectoryExclusion
from xumd.cleanup import feature as cleanup_feature
from xumd.daemon import containment_feature
from xumd.gc import feature as gc_feature
from xumd.lifecycle import feature as lifecycle_feature
from xumd.lifecycle.hooks import LifecycleHooks
from xumd.processes import feature as processes_feature
from xumd.recovery import feature as recovery_feature
from xumd.system.git import Git
from xumd.turns import feature as turns_feature
from xumd.usage import feature as usage_feature


def install(app: App, containment: containment_feature.Installed) -> None:
    hooks = app.provide(LifecycleHooks())
    cont = containment.containment
    # Shared by lifecycle, cleanup and processes, built here so none reaches into another:
    git = app.provide(Git(timeout_s=app.config.git_timeout_s, containment=cont))
    directories = app.provide(DirectoryExclusion(wait_s=app.config.lock_wait_s))
    leases = processes_feature.leases(app)
    scripts = app.provide(lifecycle_feature.scripts(app, leases=leases, containment=cont))
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
    workspaces = lifecycle_feature.install(  # projects, workspaces: uses cleanup
        app,
        git=git,
        directories=directories,
        scripts=scripts,
        snapshots=snapshots,
        cleanup=cleanup,
        hooks=hooks,
    )
    processes_feature.install(  # processes + leases
        app, workspaces=workspaces, leases=leases, hooks=hooks, containment=cont
    )
    turns = turns_feature.install(app, workspaces=workspaces)  # delegated turns
    usage = usage_feature.install(  # disk usage (after lifecycle and cleanup); built lazily
        app, git=git, workspaces=workspaces, cleanup=cleanup
    )
    recovery_feature.install(  # startup pass + strays (last: runs after the others' hooks)
        app, workspaces=workspaces, git=git, turns=turns, hooks=hooks
    )
    gc_feature.install(  # gc policies (after usage and recovery: it uses both); built lazily
        app, git=git, hooks=hooks, usage=usage, workspaces=workspaces
    )
    containment_feature.wire(containment, leases=leases)
    hooks.require_wired()  # processes' and recovery's, bound late (hooks.LifecycleHooks says why)
