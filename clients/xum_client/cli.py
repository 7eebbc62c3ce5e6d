"""`xum`: the command line client.

Heavy imports (rich) stay inside the commands that print tables: start-up time matters for a CLI
run in editor hooks.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from xum_client.errors import DaemonNotRunning, NotFound, XumRpcError
from xum_client.sync import Client

EXIT_ERROR = 1
EXIT_NOT_FOUND = 3
EXIT_NO_DAEMON = 4


class Ctx:
    def __init__(self, root: str | None, as_json: bool) -> None:
        self.root = root
        self.as_json = as_json

    def client(self) -> Client:
        return Client(self.root, client_name="xum-cli")

    def emit(self, data: Any, human: str | None = None) -> None:
        if self.as_json or human is None:
            click.echo(json.dumps(data, indent=None if self.as_json else 2, default=str))
        else:
            click.echo(human)


@click.group()
@click.option("--root", envvar="XUM_ROOT", help="daemon root (default ~/.local/state/xum)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def cli(ctx: click.Context, root: str | None, as_json: bool) -> None:
    """xum: talk to the workspace lifecycle daemon."""
    ctx.obj = Ctx(root, as_json)


@cli.command()
@click.pass_obj
def status(obj: Ctx) -> None:
    """Show the daemon's status."""
    with obj.client() as client:
        result = client.call("daemon.status")
    obj.emit(
        result,
        f"xumd {result['version']} pid {result['pid']} on {result['root']}, "
        f"up {result['uptime_s']:.0f}s, {result['connections']} connection(s)",
    )


def _register_commands() -> None:
    # Each domain module adds its own commands (owned by its feature).
    from importlib import import_module

    for name in ("project", "workspace", "cleanup", "process", "turn"):
        try:
            module = import_module(f"xum_client.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"xum_client.commands.{name}":
                raise
            continue
        module.register(cli)


_register_commands()


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(EXIT_ERROR)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except DaemonNotRunning as exc:
        click.echo(f"xum: {exc}", err=True)
        sys.exit(EXIT_NO_DAEMON)
    except NotFound as exc:
        click.echo(f"xum: {exc}", err=True)
        sys.exit(EXIT_NOT_FOUND)
    except XumRpcError as exc:
        click.echo(f"xum: {exc.kind}: {exc}", err=True)
        sys.exit(EXIT_ERROR)
