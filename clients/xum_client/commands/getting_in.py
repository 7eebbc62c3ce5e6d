"""`xum ws path` and `xum ws open`: getting into a workspace.

`xum ws path REF` prints only the checkout's path, so `cd "$(xum ws path web/fix)"` works; any
problem (unknown, archived, removed, a checkout missing on disk) goes to stderr with a non-zero
exit and nothing on stdout, so that `cd` fails instead of going somewhere else.

`xum ws open REF` runs an editor on the checkout: `--with CMD`, else `[open] command` of the
client config (`$XUM_CLIENT_CONFIG`, else `$XDG_CONFIG_HOME/xum/config.toml`, else
`~/.config/xum/config.toml`), else `$VISUAL`, else `$EDITOR`. The command is split like a shell
word list (no shell runs it) and the path is its last argument.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import click

from xum_client.commands._context import Ctx
from xum_client.commands._resolve import workspace_id
from xum_client.errors import NotFound
from xum_client.sync import Client

CONFIG_ENV = "XUM_CLIENT_CONFIG"


def client_config_path() -> Path:
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "xum" / "config.toml"


def _config_open_command() -> list[str] | None:
    path = client_config_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise click.ClickException(f"cannot read {path}: {exc}") from None
    table = data.get("open", {})
    command = table.get("command") if isinstance(table, dict) else None
    if command is None:
        return None
    if isinstance(command, str):
        return _split(command, f"[open] command in {path}")
    if isinstance(command, list) and command and all(isinstance(c, str) for c in command):
        return list(command)
    raise click.ClickException(
        f"{path}: [open] command must be a string or a non-empty list of strings"
    )


def _split(text: str, where: str) -> list[str]:
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise click.ClickException(f"{where}: {exc}") from None
    if not argv:
        raise click.ClickException(f"{where} is empty")
    return argv


def open_command(given: str | None) -> tuple[list[str], str]:
    """The editor command and where it came from."""
    if given:
        return _split(given, "--with"), "--with"
    configured = _config_open_command()
    if configured:
        return configured, f"[open] command in {client_config_path()}"
    for var in ("VISUAL", "EDITOR"):
        value = os.environ.get(var, "").strip()
        if value:
            return _split(value, f"${var}"), f"${var}"
    raise click.ClickException(
        "no editor to open it with: pass --with CMD, set [open] command in "
        f"{client_config_path()}, or set $VISUAL or $EDITOR"
    )


def _resolve(client: Client, ref: str) -> str:
    """An id, PROJECT/NAME, or a bare NAME that exactly one workspace has."""
    if ref.startswith("ws_") or "/" in ref:
        return workspace_id(client, ref)
    named = [w for w in client.call("workspace.list")["workspaces"] if w["name"] == ref]
    if len(named) == 1:
        return str(named[0]["id"])
    if not named:
        raise NotFound(-32001, f"no workspace named {ref!r}", {"kind": "not_found"})
    raise click.ClickException(
        f"{len(named)} workspaces are named {ref!r}; give PROJECT/NAME or the id: "
        + ", ".join(str(w["id"]) for w in named)
    )


def usable_checkout(obj: Ctx, ref: str) -> dict[str, Any]:
    """The workspace REF, if its checkout is there to enter (active, on disk)."""
    with obj.client() as client:
        ws = client.call("workspace.get", {"workspace_id": _resolve(client, ref)})["workspace"]
    if ws["state"] != "active":
        hint = " (xum ws unarchive first)" if ws["state"] == "archived" else ""
        raise click.ClickException(
            f"workspace {ws['name']!r} is {ws['state']}: it has no checkout to enter{hint}"
        )
    # Through --host the checkout is on the host: its daemon's word (active) is what we have.
    if obj.host is None and not Path(ws["path"]).is_dir():
        raise click.ClickException(
            f"the checkout of workspace {ws['name']!r} is missing: {ws['path']}"
        )
    return dict(ws)


def register_into(ws: click.Group) -> None:
    @ws.command("path")
    @click.argument("ref")
    @click.pass_obj
    def path(obj: Ctx, ref: str) -> None:
        """Print the checkout path of an active workspace (for `cd "$(xum ws path REF)"`)."""
        found = usable_checkout(obj, ref)
        obj.emit({"workspace_id": found["id"], "path": found["path"]}, found["path"])

    @ws.command("open")
    @click.argument("ref")
    @click.option("--with", "with_", metavar="CMD", help="the editor command to run")
    @click.pass_obj
    def open_(obj: Ctx, ref: str, with_: str | None) -> None:
        """Open an active workspace's checkout in an editor (--with, [open] command in the
        client config, $VISUAL or $EDITOR)."""
        obj.require_local("xum ws open")
        found = usable_checkout(obj, ref)
        argv, source = open_command(with_)
        try:
            # The editor owns the terminal until it exits (a GUI one returns at once).
            code = subprocess.call(  # noqa: S603 - the user's own editor command, no shell
                [*argv, found["path"]], cwd=found["path"]
            )
        except OSError as exc:
            raise click.ClickException(f"cannot run {argv[0]!r} (from {source}): {exc}") from None
        if code != 0:
            raise click.ClickException(f"{argv[0]!r} (from {source}) exited with {code}")
        if obj.as_json:
            obj.emit({"workspace_id": found["id"], "path": found["path"], "argv": argv})
