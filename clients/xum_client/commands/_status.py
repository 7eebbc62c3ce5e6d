"""`xum status`'s lines, from `daemon.status`: no click, no rich, so that the fast entry
(`xum_client.entry`) prints them without loading the command line's framework."""

from __future__ import annotations

import time
from typing import Any


def age(at: float) -> str:
    seconds = max(0.0, time.time() - at)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def first_line(text: str | None, limit: int = 80) -> str:
    if not text:
        return ""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def cleanup_line(summary: dict[str, Any] | None) -> str:
    """One line for `xum status`: the pending count and the oldest pending obligation."""
    if not summary:
        return "unknown"
    pending = int(summary.get("pending", 0))
    line = f"{pending} pending obligation(s)"
    oldest = summary.get("oldest")
    if pending and oldest:
        line += (
            f"; oldest {oldest['kind']} of {oldest['workspace_id'] or '(trash)'} "
            f"({age(oldest['created_at'])} old, {oldest['attempts']} attempt(s))"
        )
        if oldest.get("last_error"):
            line += f": {first_line(oldest['last_error'], 60)}"
    if summary.get("abandoned"):
        line += f"; {summary['abandoned']} abandoned"
    return line


def containment_line(contained: dict[str, Any]) -> str:
    """How the daemon contains what it starts, and what escaped it (docs/PROCESSES.md)."""
    line = str(contained.get("mechanism"))
    if contained.get("degraded"):
        # Weaker than configured (protocol 1.3): said where a user looks, not only in the log.
        line += f"; degraded: {contained['degraded']}"
    escaped = contained.get("escaped") or []
    if escaped:
        pids = ", ".join(str(e.get("pid")) for e in escaped[-5:])
        line += f"; {len(escaped)} process(es) could not be stopped (pid {pids})"
    return line


def status_lines(result: dict[str, Any]) -> list[tuple[str, str]]:
    details = result.get("details") or {}
    return [
        ("daemon", f"xumd {result['version']} (protocol {result['protocol']})"),
        ("pid", str(result["pid"])),
        ("root", str(result["root"])),
        ("uptime", f"{result['uptime_s']:.0f}s"),
        ("connections", str(result["connections"])),
        ("state", "shutting down" if result.get("shutting_down") else "serving"),
        *(
            [("interrupted", str(recovery["interrupted"])), ("strays", str(recovery["strays"]))]
            if (recovery := details.get("recovery"))
            else []
        ),
        *([("cleanup", cleanup_line(details["cleanup"]))] if "cleanup" in details else []),
        *(
            [("containment", containment_line(contained))]
            if (contained := details.get("containment"))
            else []
        ),
        *(
            [
                (
                    "descriptors",
                    f"{fds['open']} open, limit {fds['soft']} (hard {fds['hard']}); "
                    f"at most {fds['max_connections']} connections",
                )
            ]
            if (fds := details.get("fds"))
            else []
        ),
    ]


def plain(result: dict[str, Any]) -> str:
    """The status as `xum status` prints it off a terminal: one `key: value` line each."""
    return "".join(f"{key + ':':<13}{value}\n" for key, value in status_lines(result))
