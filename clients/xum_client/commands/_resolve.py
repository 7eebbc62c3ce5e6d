"""Resolve what a user types (an id, a project name, `project/name`) to daemon ids."""

from __future__ import annotations

from typing import Any

import click

from xum_client.errors import InvalidParams, NotFound
from xum_client.sync import Client


def given(**values: Any) -> dict[str, Any]:
    """The options the user gave (None and empty dropped), as request params."""
    return {key: value for key, value in values.items() if value}


def pairs_option(pairs: tuple[str, ...], option: str, shape: str) -> dict[str, str]:
    """Repeated `option NAME=VALUE` options, as a dict; a pair without `=` or a name is a
    usage error naming the option and the `shape` it wants (`NAME=VALUE`, `K=V`)."""
    values: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r}: give {shape}", param_hint=option)
        values[name] = value
    return values


def env_option(pairs: tuple[str, ...]) -> dict[str, str]:
    """The `--env NAME=VALUE` options given, as a dict (a pair without `=` or a name: usage)."""
    return pairs_option(pairs, "--env", "NAME=VALUE")


def _not_found(message: str) -> NotFound:
    return NotFound(-32001, message, {"kind": "not_found"})


def project_id(client: Client, text: str) -> str:
    if text.startswith("prj_"):
        return text
    for project in client.call("project.list")["projects"]:
        if project["name"] == text:
            return str(project["id"])
    raise _not_found(f"no project named {text!r}")


def workspace_id(client: Client, text: str) -> str:
    """`ws_<hex>` as is; `project/name` looked up (project by name or id)."""
    if text.startswith("ws_"):
        return text
    project, sep, name = text.rpartition("/")
    if not sep or not project or not name:
        raise InvalidParams(
            -32602,
            f"{text!r}: give a workspace id (ws_...) or PROJECT/NAME",
            {"kind": "invalid_params"},
        )
    pid = project_id(client, project)
    for ws in client.call("workspace.list", {"project_id": pid})["workspaces"]:
        if ws["name"] == name:
            return str(ws["id"])
    raise _not_found(f"no workspace {name!r} in project {project!r}")


def short(ws: dict[str, Any]) -> str:
    flags = " (interrupted)" if ws.get("interrupted") else ""
    branch = ws.get("branch") or "-"
    return f"{ws['id']}  {ws['name']:<20} {ws['state']:<10} {branch:<24} {ws['path']}{flags}"
