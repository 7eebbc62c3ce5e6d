"""The composition root: build every service and wire them, in one place.

Order matters: features that others depend on are installed first, and startup hooks (recovery)
run in installation order before the daemon is ready.
"""

from __future__ import annotations

from xumd.app import App
from xumd.cleanup import feature as cleanup_feature
from xumd.gc import feature as gc_feature
from xumd.lifecycle import feature as lifecycle_feature
from xumd.lifecycle.seams import LifecycleHooks
from xumd.processes import feature as processes_feature
from xumd.recovery import feature as recovery_feature
from xumd.rpc import spec_examples
from xumd.services import containment_service, daemon_service
from xumd.turns import feature as turns_feature
from xumd.usage import feature as usage_feature


def install_features(app: App) -> None:
    app.provide(LifecycleHooks())
    daemon_service.install(app)
    containment_service.install(app)  # first: its start-up sweep runs before adoption/recovery
    # Feature installs, in dependency order (each line owned by its feature):
    lifecycle_feature.install(app)  # lifecycle (projects, workspaces)
    cleanup_feature.install(app)  # cleanup obligations + retry (after lifecycle)
    lifecycle_feature.wire_cleanup(app)  # the unsaved-work check before trashing (after both)
    processes_feature.install(app)  # processes + leases (after lifecycle and cleanup)
    turns_feature.install(app)  # delegated turns (after lifecycle)
    usage_feature.install(app)  # disk usage (after lifecycle and cleanup)
    recovery_feature.install(app)  # startup pass + strays (last: runs after the others' hooks)
    gc_feature.install(app)  # gc policies (after usage and recovery: it uses both)
    containment_service.wire(app)
    if app.config.enable_test_methods:
        spec_examples.install(app.router)
