"""`Ctx`: what every command gets with `@click.pass_obj` (the root, --json, a client, output).

Its own module so that the command modules and the `cli` facade that loads them both import it,
and no command imports the facade back.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from xum_client.sync import Client, default_root

EXIT_NOT_DONE = 1
"""A result that says part of the work was not done (`Ctx.emit_result`): the error exit."""


class Ctx:
    """What every command gets with `@click.pass_obj`."""

    def __init__(
        self,
        root: str | None,
        as_json: bool,
        socket: str | None = None,
        host: str | None = None,
        request_key: str | None = None,
    ) -> None:
        self.host = host
        self.request_key = request_key
        """--request-key: names the command's first mutating call (docs/PROTOCOL.md, "Request
        keys"); None: a new key per call (the client's own retry reuses it)."""
        """--host, else XUM_HOST: the daemon on that host (docs/HOSTS.md); None: this machine."""
        self.root = root
        """--root as given on the command line (XUM_ROOT is read by the discovery rule)."""
        self.socket = socket
        """--socket as given on the command line."""
        self.as_json = as_json

    @property
    def root_path(self) -> str:
        return str(self.root or default_root())

    def client(self, **kwargs: Any) -> Client:
        kwargs.setdefault("client_name", "xum-cli")
        kwargs.setdefault("socket_path", self.socket)
        kwargs.setdefault("host", self.host)
        kwargs.setdefault("request_key", self.request_key)
        return Client(self.root, **kwargs)

    def require_local(self, what: str) -> None:
        """Refuse `what` with --host: it acts on this machine (a usage error saying so)."""
        if self.host is not None:
            raise click.UsageError(
                f"{what} acts on this machine, not through --host {self.host} "
                f"(run it there: ssh to the host, or unset XUM_HOST)"
            )

    def emit(self, data: Any, human: str | None = None) -> None:
        """Print `data` as JSON with --json (or when there is no human form), else `human`."""
        if self.as_json or human is None:
            click.echo(json.dumps(data, indent=None if self.as_json else 2, default=str))
        else:
            click.echo(human)

    def emit_result(self, data: Any, human: str, *, not_done: bool) -> None:
        """`emit` a result the daemon answered, then exit 1 when the result itself says part of
        what was asked was not done (a setup or a cleanup that `failed`, a removal cut short:
        README, "Errors"). The result is printed whole either way (never the `{"error"}`
        form: the daemon did act), so a script reads what happened and what is left."""
        self.emit(data, human)
        if not_done:
            raise SystemExit(EXIT_NOT_DONE)

    def table(
        self, data: Any, columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str = ""
    ) -> None:
        """`data` as JSON with --json; else a table (rich on a terminal, plain text otherwise)."""
        if self.as_json:
            self.emit(data)
            return
        cells = [[("" if c is None else str(c)) for c in row] for row in rows]
        if sys.stdout.isatty():
            from rich.console import Console
            from rich.table import Table

            table = Table(*columns, title=title or None)
            for row in cells:
                table.add_row(*row)
            Console().print(table)
            return
        widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(columns)]
        lines = [list(columns), *cells]
        for line in lines:
            click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=False)).rstrip())


F = TypeVar("F", bound=Callable[..., Any])


def host_timeout_option(what: str) -> Callable[[F], F]:
    """`--host-timeout`, the per-host deadline of an `--all-hosts` command (`what` each host may
    take: its connection, or its connection and call)."""
    return click.option(
        "--host-timeout",
        type=click.FloatRange(min=0.1),
        default=15.0,
        show_default=True,
        help=f"With --all-hosts: seconds each host's {what} may take.",
    )
