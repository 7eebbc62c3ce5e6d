"""`xum cleanup ls|retry`: pending physical cleanup (teardown, trash, reclaim) and its retries.

`status_line(details)` renders `daemon.status` details['cleanup'] for `xum status` (it lives in
`commands/_status.py`, which the fast entry uses without click).
"""

from __future__ import annotations

import time
from typing import Any

import click

from xum_client.commands._context import EXIT_NOT_DONE, Ctx
from xum_client.commands._outcomes import cleanup_failed
from xum_client.commands._resolve import workspace_id
from xum_client.commands._status import cleanup_line as status_line
from xum_client.commands._status import first_line as _first_line

LONG_TIMEOUT_S = 3600.0
"""A retry runs teardown scripts and deletions inline: wait for them."""


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    delta = at - time.time()
    return "now" if delta <= 0 else f"in {delta:.0f}s"


def _rows(obligations: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for ob in obligations:
        note = ob.get("reason") or _first_line(ob.get("last_error"))
        if ob["kind"] == "reclaim" and ob.get("bytes") is not None:
            note = note or f"{ob['bytes']} bytes"
        rows.append(
            [
                ob["id"],
                ob["workspace_id"] or "(trash)",
                ob["kind"],
                ob["state"],
                ob["attempts"],
                _when(ob.get("next_attempt_at")) if ob["state"] == "pending" else "",
                note,
            ]
        )
    return rows


COLUMNS = ["id", "workspace", "kind", "state", "attempts", "next", "error / reason"]


def register(cli: click.Group) -> None:
    @cli.group("cleanup")
    def cleanup() -> None:
        """Physical cleanup obligations (teardown, trash, reclaim) and their retries."""

    @cleanup.command("ls")
    @click.option("--workspace", "workspace_ref", help="ws_... or PROJECT/NAME")
    @click.option(
        "--state", type=click.Choice(["pending", "completed", "abandoned", "failed"]), default=None
    )
    @click.pass_obj
    def ls(obj: Ctx, workspace_ref: str | None, state: str | None) -> None:
        """List obligations: pending, and recently completed or abandoned."""
        with obj.client() as client:
            params: dict[str, Any] = {}
            if workspace_ref:
                params["workspace_id"] = workspace_id(client, workspace_ref)
            if state:
                params["state"] = state
            result = client.call("cleanup.list", params)
        obligations = result["obligations"]
        if not obligations and not obj.as_json:
            click.echo(f"no cleanup obligations ({result['pending']} pending in total)")
            return
        obj.table(result, COLUMNS, _rows(obligations))

    @cleanup.command("retry")
    @click.argument("target", required=False)
    @click.pass_obj
    def retry(obj: Ctx, target: str | None) -> None:
        """Run pending cleanup now: TARGET is an obligation (ob_...), a workspace (ws_... or
        PROJECT/NAME), or nothing for everything due."""
        with obj.client(timeout=LONG_TIMEOUT_S) as client:
            params: dict[str, Any] = {}
            if target and target.startswith("ob_"):
                params["obligation_id"] = target
            elif target:
                params["workspace_id"] = workspace_id(client, target)
            result = client.call("cleanup.retry", params)
        not_done = any(cleanup_failed(status) for status in result["workspaces"].values())
        if obj.as_json:
            obj.emit_result(result, "", not_done=not_done)
            return
        for wid, status in result["workspaces"].items():
            line = f"{wid}: cleanup {status['status']}"
            if status["status"] == "pending":
                line += f", attempt {status['attempts']}, next {_when(status['next_attempt_at'])}"
            reclaim = status.get("reclaim")
            if reclaim:
                line += f"; reclaim {reclaim['status']}"
                if reclaim.get("bytes") is not None:
                    line += f" ({reclaim['bytes']} bytes)"
            click.echo(line)
            if status.get("last_error"):
                click.echo("  " + status["last_error"].strip().replace("\n", "\n  "))
            if status.get("reason"):
                click.echo(f"  {status['reason']}")
        if not result["workspaces"]:
            click.echo("nothing was due")
        if not_done:
            raise SystemExit(EXIT_NOT_DONE)


__all__ = ["register", "status_line"]
