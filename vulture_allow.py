"""What vulture (`make lint`) reads as unused but something it cannot see uses: each entry says
who. vulture matches by name and never runs this file; a name that goes from the code goes from
here too (vulture then reports the entry itself as unused)."""

from vulture.whitelist_utils import Whitelist

_ = Whitelist()

# asyncio calls a protocol's callbacks by name (daemon/xumd/rpc/transport.py).
_.connection_made
_.data_received
_.eof_received
_.connection_lost
_.pause_writing
_.resume_writing

# Python calls a module's `__getattr__` for a missing attribute (PEP 562): xum_client's lazy
# `AsyncClient`.
_.__getattr__

# Attributes other libraries read: sqlite3's `row_factory` (store/db.py, lifecycle/listing.py,
# bench/scale.py), tarfile's `uname`/`gname` (hostinstall.py), pydantic's plugin loader's
# `get_plugins` (main.py), structlog's calls of its logger's method by level name (logs.py).
_.row_factory
_.uname
_.gname
_.get_plugins
_.warn
_.critical
_.fatal

# The specs of the daemon's own methods: `xum_protocol.methods` gathers them from their module's
# variables, and the daemon registers these by name, before their models load (daemon/feature.py).
_.HELLO
_.DAEMON_STATUS
_.DAEMON_SHUTDOWN
_.EVENTS_SUBSCRIBE

# Wire fields: results are built by keyword and read by clients over the socket, never by name
# in Python (protocol/xum_protocol/models/, rpc/spec_examples.py).
_.stopped_at_start
_.shutting_down
_.recovered
_.previous_name
_.previous_path
_.obligation
_.resync_required
_.age_days
_.released
_.dropped_total
_.config_path
_.files_truncated
_.uncommitted
_.kept_files
_.apparent_bytes
_.mounts_skipped
_.age_s
_.workspaces_bytes
_.pending_reclaims
_.pending_reclaim_bytes
_.pool_entries
_.total_bytes
_.cleared_locks
_.base_commit
_.ignored_copy
_.materialised
_.sparse_kept
_.ports_replaced
_.ports_taken
_.limit_bytes
_.slept

# The documented shape of daemon.status' `containment` details: containment.py writes the dict
# by hand (the model's import is not on the way to readiness) and tests/daemon/test_lean_start.py
# validates what it writes against this model.
_.ContainmentStatus

# The documented shape of daemon.status' `platform` details: system/platform writes the dict by
# hand (before the models load) and tests/daemon/test_platform_status.py validates it.
_.PlatformStatus
_.weaker

# The disk budget's documented shapes: daemon.status' `gc` details (gc/feature.py writes the
# dict by hand; tests/gc/test_budget.py validates it), the figures `xum du` / `xum gc --dry-run`
# render, and the `gc.budget_exceeded` event's keywords (gc/service.py publishes them).
_.GcStatus
_.size_bytes
_.unmet_bytes
_.freed_bytes

# The Python client's public property, for a program that embeds it: the pid of the ssh
# process carrying a `host=` connection.
_.ssh_pid
