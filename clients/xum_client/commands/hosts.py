"""`xum bridge` (the host side of `--host`) and `xum host add|ls|rm|check` (docs/HOSTS.md)."""

from __future__ import annotations

import sys

import click

from xum_client.commands._context import Ctx
from xum_client.commands._resolve import pairs_option
from xum_client.hosts import (
    HostConfigError,
    HostEntry,
    add_host,
    get_host,
    hosts_file,
    load_hosts,
    remove_host,
)


def _config_error(exc: HostConfigError) -> click.ClickException:
    return click.ClickException(str(exc))


def register(cli: click.Group) -> None:
    @cli.command("bridge")
    @click.option("--root", "bridge_root", help="The daemon root on this machine.")
    @click.option("--socket", "bridge_socket", help="The daemon socket on this machine.")
    @click.option(
        "--start-timeout",
        default=30.0,
        show_default=True,
        help="Seconds a daemon started here may take to accept.",
    )
    @click.pass_obj
    def bridge(
        obj: Ctx, bridge_root: str | None, bridge_socket: str | None, start_timeout: float
    ) -> None:
        """Relay stdin/stdout to the daemon's socket, starting the daemon if none runs.

        What `ssh HOST xum bridge` runs for a client elsewhere (`xum --host`); it never follows
        --host or XUM_HOST itself."""
        from xum_client import bridge as relay

        root = bridge_root or obj.root
        socket_path = bridge_socket or obj.socket
        sys.stdout.flush()
        sys.exit(relay.run(root, socket_path, start_timeout))

    @cli.group("host")
    def host() -> None:
        """Hosts reached through ssh (`xum --host NAME ...`), kept in the hosts file."""

    @host.command("add")
    @click.argument("name")
    @click.argument("dest")
    @click.option("--remote-root", help="The daemon root on the host (default: the host's own).")
    @click.option(
        "--ssh-option",
        "ssh_options",
        multiple=True,
        metavar="K=V",
        help="An ssh option for this host (repeatable), e.g. ConnectTimeout=5.",
    )
    @click.option("--replace", is_flag=True, help="Replace an existing entry of that name.")
    @click.pass_obj
    def host_add(  # noqa: PLR0917 - one parameter per click option
        obj: Ctx,
        name: str,
        dest: str,
        remote_root: str | None,
        ssh_options: tuple[str, ...],
        replace: bool,
    ) -> None:
        """Add host NAME, reached as `ssh DEST` (an ~/.ssh/config alias works)."""
        entry = HostEntry(name, dest, remote_root, pairs_option(ssh_options, "--ssh-option", "K=V"))
        try:
            add_host(entry, replace=replace)
        except HostConfigError as exc:
            raise _config_error(exc) from None
        obj.emit(
            {"host": entry.as_dict(), "file": str(hosts_file())},
            f"added host {name} ({dest}) to {hosts_file()}",
        )

    @host.command("ls")
    @click.pass_obj
    def host_ls(obj: Ctx) -> None:
        """List the hosts."""
        try:
            hosts = load_hosts()
        except HostConfigError as exc:
            raise _config_error(exc) from None
        data = {
            "hosts": [hosts[n].as_dict() for n in sorted(hosts)],
            "file": str(hosts_file()),
        }
        rows = [
            (
                e.name,
                e.dest,
                e.remote_root or "(default)",
                " ".join(f"{k}={v}" for k, v in sorted(e.ssh_options.items())),
            )
            for e in (hosts[n] for n in sorted(hosts))
        ]
        if not rows and not obj.as_json:
            click.echo(f"no hosts ({hosts_file()}); add one with `xum host add NAME DEST`")
            return
        obj.table(data, ["name", "dest", "remote root", "ssh options"], rows)

    @host.command("rm")
    @click.argument("name")
    @click.pass_obj
    def host_rm(obj: Ctx, name: str) -> None:
        """Remove host NAME (its daemon is left alone)."""
        try:
            entry = remove_host(name)
        except HostConfigError as exc:
            raise _config_error(exc) from None
        obj.emit({"removed": entry.as_dict()}, f"removed host {name}")

    @host.command("check")
    @click.argument("name")
    @click.option("--timeout", default=30.0, show_default=True, help="Seconds for the hello.")
    @click.pass_obj
    def host_check(obj: Ctx, name: str, timeout: float) -> None:
        """Connect to NAME through ssh and the bridge; print its daemon's version, root, pid."""
        from xum_client.sync import Client

        try:
            entry = get_host(name)
        except HostConfigError as exc:
            raise _config_error(exc) from None
        with Client(None, host=entry.name, timeout=timeout, client_name="xum-host-check") as c:
            hello = c.server or {}
        server = hello.get("server") or {}
        info = {
            "host": entry.name,
            "dest": entry.dest,
            "version": server.get("version"),
            "protocol": hello.get("protocol"),
            "root": hello.get("root"),
            "pid": hello.get("pid"),
            "socket": hello.get("socket"),
        }
        obj.emit(
            info,
            f"{entry.name} ({entry.dest}): xumd {info['version']} (protocol "
            f"{info['protocol']}), root {info['root']}, pid {info['pid']}",
        )
