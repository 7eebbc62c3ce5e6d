"""The composition root: build every service and wire them, in one place.

Order matters: features that others depend on are installed first, and startup hooks (recovery)
run in installation order before the daemon is ready. Each feature gets its collaborators from
here, explicitly (git, the directory exclusion, the script runner, the lifecycle hooks, the
services of the features below it), never by looking a class up by name; which package may
import which is the table in tests/test_architecture.py.
"""

from __future__ import annotations

from xumd import containment_feature, daemon_feature
from xumd.app import App
from xumd.checkouts.exclusion import DirectoryExclusion
from xumd.cleanup import feature as cleanup_feature
from xumd.gc import feature as gc_feature
from xumd.git import Git
from xumd.lifecycle import feature as lifecycle_feature
from xumd.lifecycle.seams import LifecycleHooks
from xumd.processes import feature as processes_feature
from xumd.recovery import feature as recovery_feature
from xumd.turns import feature as turns_feature
from xumd.usage import feature as usage_feature


def import_deferred() -> None:
    """Import now what the features built at their first request (`rpc.deferred`: gc, usage)
    import then: `--list-fault-points` and `XUM_FAULT` must see every point a module declares."""
    from xumd.gc import service as gc_service  # noqa: F401
    from xumd.usage import service as usage_service  # noqa: F401


def install_features(app: App) -> None:
    hooks = app.provide(LifecycleHooks())
    daemon_feature.install(app)
    containment = containment_feature.install(app)  # first: its sweep runs before adoption
    # Shared by lifecycle and cleanup, built here so neither reaches into the other:
    git = app.provide(Git(timeout_s=app.config.git_timeout_s))
    directories = app.provide(DirectoryExclusion(wait_s=app.config.lock_wait_s))
    scripts = app.provide(lifecycle_feature.scripts(app))
    # Feature installs, in dependency order (each line owned by its feature):
    cleanup = cleanup_feature.install(  # cleanup obligations + retry
        app, git=git, directories=directories, scripts=scripts
    )
    workspaces = lifecycle_feature.install(  # projects, workspaces: uses cleanup
        app, git=git, directories=directories, scripts=scripts, cleanup=cleanup, hooks=hooks
    )
    supervisor = processes_feature.install(  # processes + leases
        app, workspaces=workspaces, scripts=scripts, hooks=hooks
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
    containment_feature.wire(containment, git=git, scripts=scripts, supervisor=supervisor)
    if app.config.enable_test_methods:
        # Imported here: its models are built at import, and only test daemons serve them.
        from xumd.rpc import spec_examples

        spec_examples.install(app.router)
