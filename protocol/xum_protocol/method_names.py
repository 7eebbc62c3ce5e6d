"""The names of the protocol's methods, without their models: what a server answers `hello`'s
`capabilities` from, and registers before any model is loaded, and which of them are
mutating (a client's retry names them with a request key). Written from
`xum_protocol.methods.METHODS` by `make schema` (tests/protocol/test_method_table.py checks
it is fresh): do not edit."""

from __future__ import annotations

METHOD_NAMES: frozenset[str] = frozenset(
    {
        "hello",
        "daemon.status",
        "daemon.shutdown",
        "project.add",
        "project.list",
        "project.get",
        "project.remove",
        "project.trust",
        "workspace.create",
        "workspace.list",
        "workspace.get",
        "workspace.reallocate_ports",
        "workspace.rename",
        "workspace.archive",
        "workspace.unarchive",
        "workspace.remove",
        "workspace.setup",
        "workspace.keep",
        "workspace.usage",
        "gc.plan",
        "gc.run",
        "gc.get",
        "cleanup.list",
        "cleanup.retry",
        "process.spawn",
        "process.list",
        "process.get",
        "process.output",
        "process.write",
        "process.resize",
        "process.signal",
        "process.wait",
        "process.stop",
        "process.background",
        "process.release_all",
        "process.holders",
        "lease.acquire",
        "lease.release",
        "lease.list",
        "turn.create",
        "turn.get",
        "turn.list",
        "turn.end",
        "workspace.strays",
        "workspace.discard_kept",
        "events.subscribe",
    }
)

MUTATING: frozenset[str] = frozenset(
    {
        "project.add",
        "project.remove",
        "project.trust",
        "workspace.create",
        "workspace.reallocate_ports",
        "workspace.rename",
        "workspace.archive",
        "workspace.unarchive",
        "workspace.remove",
        "workspace.setup",
        "workspace.keep",
        "gc.run",
        "cleanup.retry",
        "process.spawn",
        "process.write",
        "process.resize",
        "process.signal",
        "process.stop",
        "process.background",
        "process.release_all",
        "lease.acquire",
        "lease.release",
        "turn.create",
        "turn.end",
        "workspace.discard_kept",
    }
)
"""The methods whose params accept a `request_key` (`MethodSpec.mutating`)."""
