"""`xum self`: the workspace this command runs in (by `XUM_WORKSPACE_ID`, else the checkout that
holds the current directory), with its ports, env and processes: an agent inside a workspace
asks about itself without knowing ids (`xum_client.locate`)."""

from __future__ import annotations

import os
from typing import Any

import click

from xum_client.commands._context import Ctx
from xum_client.commands._resolve import short
from xum_client.locate import WORKSPACE_ENV, current


def _human(result: dict[str, Any]) -> str:
    ws = result["workspace"]
    lines = [short(ws)]
    if ws.get("interrupted"):
        lines.append(f"interrupted: {ws.get('interrupted_reason') or 'no reason recorded'}")
    lines.append("ports: " + (" ".join(str(p) for p in ws.get("ports") or []) or "-"))
    env = ws.get("env") or {}
    lines.append("env: " + (" ".join(f"{k}={v}" for k, v in sorted(env.items())) or "-"))
    processes = result["processes"]
    if not processes:
        lines.append("processes: none")
    for process in processes:
        argv = " ".join(process["argv"])[:80]
        lines.append(f"process: {process['id']}  {process['kind']:<8} {process['state']:<8} {argv}")
    return "\n".join(lines)


def register(cli: click.Group) -> None:
    @cli.command("self")
    @click.pass_obj
    def self_cmd(obj: Ctx) -> None:
        """The workspace this runs in: the one XUM_WORKSPACE_ID names, else the one whose
        checkout holds the current directory; with its ports, env and processes."""
        if obj.host is not None and not os.environ.get(WORKSPACE_ENV):
            # The current directory is on this machine; the host's checkouts are not.
            raise click.UsageError(
                f"xum self through --host {obj.host} needs {WORKSPACE_ENV}: the current "
                "directory is on this machine, not the host"
            )
        with obj.client() as client:
            result = current(client.call, os.getcwd(), os.environ)
        obj.emit(result, _human(result))
