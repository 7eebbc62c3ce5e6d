"""Whether a result the daemon answered says part of the work was not done (the CLI then
exits 1 after printing it: `Ctx.emit_result`), and the setup's line: shared by the workspace,
project, turn and cleanup commands."""

from __future__ import annotations

from typing import Any

SETUP_FAILED = ("failed", "timeout")
"""A setup that ran and did not succeed (`timeout`: stopped at `script_timeout_s`)."""


def setup_failed(result: dict[str, Any]) -> bool:
    """A result whose setup ran and failed or timed out (a skipped, untrusted setup is not a
    failure of a create: `xum ws setup` runs it later and says so)."""
    return (result.get("setup") or {}).get("status") in SETUP_FAILED


def cleanup_failed(cleanup: dict[str, Any] | None) -> bool:
    """A cleanup (or its reclaim) that `failed`: the daemon will not try it again by itself. A
    `pending` one is not: it names its next attempt."""
    if not cleanup:
        return False
    return "failed" in (cleanup.get("status"), (cleanup.get("reclaim") or {}).get("status"))


def setup_line(setup: dict[str, Any], ref: str | None = None) -> str:
    line = f"setup: {setup['status']}"
    if setup.get("error"):
        line += f" ({setup['error']})"
    if setup.get("hint"):
        line += f"\n  {setup['hint']}"
        if setup["status"] == "untrusted" and ref:
            # Trusting does not run a skipped setup by itself: say how.
            line += f"; then run its setup: xum ws setup {ref}"
    return line
