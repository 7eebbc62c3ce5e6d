"""`xum host install NAME`: this xum onto a host, through ssh only (docs/HOSTS.md, "Installing
on a host"). Added to the `host` group that `commands.hosts` makes."""

from __future__ import annotations

import click

from xum_client.commands._context import Ctx


def register(cli: click.Group) -> None:
    host = cli.commands.get("host")
    if not isinstance(host, click.Group):
        return

    @host.command("install")
    @click.argument("name")
    @click.option("--force", is_flag=True, help="Reinstall even when the host has this version.")
    @click.option(
        "--python",
        "python",
        metavar="PATH",
        help="The interpreter on the host (default: the first CPython >= 3.11 of python3, "
        "python3.13, python3.12, python3.11 on its PATH).",
    )
    @click.pass_obj
    def host_install(obj: Ctx, name: str, force: bool, python: str | None) -> None:
        """Install this version of xum on host NAME (the host needs no network access).

        Builds a wheelhouse here for the host's Python and platform, copies it over ssh and
        installs it into ${XDG_DATA_HOME:-~/.local/share}/xum/venv there, then removes the older
        environments it made that no process uses. Running it again with the same version does
        nothing. Linux hosts only."""
        from xum_client import hostinstall
        from xum_client.hosts import get_host

        entry = get_host(name)

        def progress(line: str) -> None:
            if not obj.as_json:
                click.echo(f"{line} ...", err=True)

        result = hostinstall.install(entry, force=force, python=python, progress=progress)
        if not result["changed"]:
            human = f"host {name} already has xum {result['version']}: nothing to do"
        else:
            before = result.get("installed_before")
            human = (
                f"installed xum {result['version']} on host {name} "
                f"({result['python']}) in {result['venv']}" + (f" (was {before})" if before else "")
            )
            # Older environments: removed, or kept saying why (a daemon still runs from one).
            for path in result.get("pruned", []):
                human += f"\nremoved the older {path}"
            for path in result.get("kept", []):
                human += f"\nkept {path}: {result.get('why', {}).get(path, 'not pruned')}"
        obj.emit(result, human)
