"""Whether a result the daemon answered says part of the work was not done (the CLI then
exits 1 after printing it: `Ctx.emit_result`), and the setup's line: shared by the workspace,
project, turn and cleanup commands."""

from __future__ import annotations

import time
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


def _when(at: float, now: float) -> str:
    """A retry time as a person reads it: how far off, and the local clock time."""
    clock = time.strftime("%H:%M:%S", time.localtime(at))
    ahead = at - now
    if ahead <= 0:
        return f"due now (was due at {clock})"
    if ahead < 120:
        return f"in {ahead:.0f}s, at {clock}"
    if ahead < 7200:
        return f"in {ahead / 60:.0f}m, at {clock}"
    return f"in {ahead / 3600:.1f}h, at {clock}"


def cleanup_line(cleanup: dict[str, Any], now: float | None = None) -> str:
    """The physical side of an archive or removal in one line (more when the error it quotes
    has several): its status, when a `pending` one is tried next, why it is pending or
    failed, and a reclaim that did not complete (a `failed` one is why the command exits 1,
    so the line must say it even when the checkout itself went)."""
    line = f"cleanup: {cleanup['status']}"
    if cleanup.get("status") == "pending":
        # The daemon retries it by itself; say when, and how to try it at once.
        if cleanup.get("next_attempt_at"):
            line += ", next attempt " + _when(cleanup["next_attempt_at"], now or time.time())
        line += " (now: xum cleanup retry)"
    if cleanup.get("last_error") or cleanup.get("reason"):
        line += f": {cleanup.get('last_error') or cleanup.get('reason')}"
    reclaim = (cleanup.get("reclaim") or {}).get("status")
    if reclaim == "failed":
        line += "\nreclaim: failed: the trashed checkout was not deleted (see xum cleanup ls)"
    return line


def setup_line(setup: dict[str, Any], ref: str | None = None) -> str:
    line = f"setup: {setup['status']}"
    if setup.get("error"):
        line += f" ({setup['error']})"
    if setup.get("hint"):
        line += f"\n  {setup['hint']}"
        if setup["status"] == "untrusted" and ref:
            # Trusting does not run a skipped setup by itself: say how.
            line += f"; then run its setup: xum ws setup {ref}"
    said = leftovers_line("setup", setup.get("leftovers"))
    if said:
        line += f"\n  {said}"
    return line


LEFTOVERS_SHOWN = 3


def leftovers_line(who: str, leftovers: list[dict[str, Any]] | None) -> str | None:
    """One line about what a run left running and the daemon stopped when the run ended (a run
    does not outlive itself), and how to keep such a process; None when it left nothing."""
    if not leftovers:
        return None
    shown = ", ".join(
        f"pid {e['pid']} ({' '.join(e.get('argv') or ['?'])[:60]}; {e.get('signal')}"
        + (f", ran {e['ran_s']:.1f}s" if isinstance(e.get("ran_s"), int | float) else "")
        + ")"
        for e in leftovers[:LEFTOVERS_SHOWN]
    )
    more = (
        f" and {len(leftovers) - LEFTOVERS_SHOWN} more" if len(leftovers) > LEFTOVERS_SHOWN else ""
    )
    count = f"{len(leftovers)} process" + ("es" if len(leftovers) != 1 else "")
    return (
        f"{who} left {count} running, stopped when it ended: {shown}{more} "
        "(to keep one running, start it as its own process: xum run --detach WS -- CMD)"
    )
