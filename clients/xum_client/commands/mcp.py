"""`xum mcp`: an MCP server on stdin/stdout, a thin client of the daemon (`xum_client.mcp`).

The MCP SDK (and the web stack it brings) is the optional extra `xum[mcp]`: it is imported
only here, inside the command, so the rest of the command line never loads it."""

from __future__ import annotations

import click

from xum_client.commands._context import Ctx


def register(cli: click.Group) -> None:
    @cli.command("mcp")
    @click.pass_obj
    def mcp_cmd(obj: Ctx) -> None:
        """Serve the daemon's workspaces to an agent as an MCP server over stdio (tools,
        resources with change notifications); docs/AGENTS.md says how to register it."""
        try:
            from xum_client.mcp.server import serve
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.partition(".")[0] not in ("mcp", "mcp_types"):
                raise
            raise click.ClickException(
                "the MCP SDK is not installed: install the extra, pip install 'xum[mcp]' "
                "(`make install` does)"
            ) from None
        serve(root=obj.root, socket_path=obj.socket, host=obj.host)
