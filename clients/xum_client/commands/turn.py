"""`xum turn new|ls|show|end`: delegated workspace turns, and `xum strays` (checkouts and git admin
entries under the root that no workspace claims, and kept copies of preserved files; also
reachable as `xum ws strays`).

An owner is addressed like any workspace: ws_... or PROJECT/NAME.
"""

from __future__ import annotations

from typing import Any

import click

from xum_client.commands._context import Ctx
from xum_client.commands._outcomes import setup_failed, setup_line
from xum_client.commands._resolve import project_id, workspace_id

LONG_TIMEOUT_S = 3600.0
"""A new target runs its setup script inside turn.create: wait for it."""


def _turn_line(t: dict[str, Any]) -> str:
    flags = " (target interrupted: keep or remove it)" if t.get("target_interrupted") else ""
    reason = f" ({t['reason']})" if t.get("reason") else ""
    target = t.get("target_workspace_id") or "-"
    return f"{t['id']}  {t['mode']:<8} {t['state']:<8} -> {target}{reason}{flags}"


def _kept_lines(s: dict[str, Any]) -> list[str]:
    facts = [f"{s['files']} file(s)"]
    if s.get("note"):
        facts.append(s["note"])
    lines = [f"{'kept':<11} {s['path']}", "  " + ", ".join(facts)]
    lines.extend(f"    {path}" for path in (s.get("kept_files") or [])[:10])
    return lines


def _stray_lines(s: dict[str, Any]) -> list[str]:
    if s["kind"] == "kept":
        return _kept_lines(s)
    lines = [f"{s['kind']:<11} {s['path']}" + ("" if s["exists"] else " (gone)")]
    facts = []
    if s.get("branch"):
        facts.append(f"branch {s['branch']}")
    if s["exists"]:
        facts.append(f"{s['files']}{'+' if s.get('files_truncated') else ''} file(s)")
        facts.append(f"{len(s.get('uncommitted') or [])} uncommitted")
    if s.get("admin_dir"):
        facts.append(f"git admin {s['admin_dir']}")
    if s.get("note"):
        facts.append(s["note"])
    lines.append("  " + ", ".join(facts))
    lines.extend(f"    {path}" for path in (s.get("uncommitted") or [])[:10])
    return lines


def show_strays(obj: Ctx, project_ref: str | None) -> None:
    with obj.client() as client:
        params: dict[str, Any] = {}
        if project_ref:
            params["project_id"] = project_id(client, project_ref)
        result = client.call("workspace.strays", params)
    lines = [line for s in result["strays"] for line in _stray_lines(s)]
    human = "\n".join(lines) if lines else "no strays"
    if any(s["kind"] != "kept" for s in result["strays"]):
        human += "\n(never deleted by xumd: inspect them, then move or delete them yourself)"
    if any(s["kind"] == "kept" for s in result["strays"]):
        human += (
            "\n(kept: copies of files a workspace was asked to preserve; take what you need, "
            "then `xum ws discard-kept PATH`)"
        )
    obj.emit(result, human)


def register(cli: click.Group) -> None:
    @cli.group()
    def turn() -> None:
        """Delegated workspace turns (an owner workspace hands a sub-task to a target)."""

    @turn.command("new")
    @click.argument("owner_ref")
    @click.option("--name", help="name of the new target workspace (default turn-XXXX)")
    @click.option("--base", help="commit to branch the target from")
    @click.option("--existing", "target_ref", help="reuse a target this owner is bound to")
    @click.option(
        "--runtime",
        type=click.Choice(["worktree", "directory"]),
        help="the new target's runtime (default: the owner's)",
    )
    @click.pass_obj
    def new(  # noqa: PLR0917 - one parameter per click option
        obj: Ctx,
        owner_ref: str,
        name: str | None,
        base: str | None,
        target_ref: str | None,
        runtime: str | None,
    ) -> None:
        """Delegate from OWNER to a new target workspace (or --existing TARGET)."""
        with obj.client(timeout=LONG_TIMEOUT_S) as client:
            params: dict[str, Any] = {"owner_workspace_id": workspace_id(client, owner_ref)}
            if target_ref:
                params.update(mode="existing", target_workspace_id=workspace_id(client, target_ref))
            else:
                params["mode"] = "new"
            if name:
                params["name"] = name
            if base:
                params["base"] = base
            if runtime:
                params["runtime"] = runtime
            result = client.call("turn.create", params)
        w = result["workspace"]
        human = f"{result['turn']['id']}: {w['name']} ({w['id']}) at {w['path']}"
        if result.get("setup"):  # a new target ran its setup
            human += "\n" + setup_line(result["setup"], w["id"])
        obj.emit_result(result, human, not_done=setup_failed(result))

    @turn.command("ls")
    @click.argument("owner_ref")
    @click.pass_obj
    def ls(obj: Ctx, owner_ref: str) -> None:
        """List the turns of an owner workspace."""
        with obj.client() as client:
            owner = workspace_id(client, owner_ref)
            result = client.call("turn.list", {"owner_workspace_id": owner})
        lines = [_turn_line(t) for t in result["turns"]]
        obj.emit(result, "\n".join(lines) if lines else "no turns")

    @turn.command("show")
    @click.argument("handle_id")
    @click.pass_obj
    def show(obj: Ctx, handle_id: str) -> None:
        """Show one turn."""
        with obj.client() as client:
            result = client.call("turn.get", {"handle_id": handle_id})
        obj.emit(result, _turn_line(result["turn"]))

    @turn.command("end")
    @click.argument("handle_id")
    @click.pass_obj
    def end(obj: Ctx, handle_id: str) -> None:
        """End a turn (its target workspace is left as it is)."""
        with obj.client() as client:
            result = client.call("turn.end", {"handle_id": handle_id})
        obj.emit(result, f"ended {handle_id}")

    @cli.command("strays")
    @click.option("--project", "project_ref", help="only this project (id or name)")
    @click.pass_obj
    def strays(obj: Ctx, project_ref: str | None) -> None:
        """Checkouts and git admin entries under the root that no workspace claims."""
        show_strays(obj, project_ref)
