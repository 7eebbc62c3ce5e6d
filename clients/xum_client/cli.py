"""`xum`: the command line client.

Start-up time matters for a CLI run from editor hooks and scripts, so the start-up path imports
only click and the light sync client: domain command modules (`commands/<domain>.py`) load the
first time one of their commands is asked for, rich loads only to draw a table on a terminal, and
pydantic never loads for the built-in commands.

Exit codes: 0 ok; 1 error; 2 usage; 3 not found; 4 no daemon on the root; 5 the connection was
lost during a call (its outcome is unknown); 6 a host could not be reached (`--host`); 141 the
reader of the output went away (`commands/_stdio.py`).
`--json` is accepted by every command (before or after its name) and prints machine-readable output;
a failure is then one JSON object on stdout, `{"error": {code, kind, message, data, exit}}`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from xum_client.commands import _status, _stdio
from xum_client.commands._context import Ctx, host_timeout_option
from xum_client.commands._status import status_lines as _status_lines
from xum_client.errors import (
    ConnectionLost,
    DaemonNotRunning,
    HostError,
    NotFound,
    XumClientError,
)
from xum_client.sync import CLIENT_VERSION, socket_path_for

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_NO_DAEMON = 4
EXIT_CONNECTION_LOST = 5
"""The connection ended while a call was in flight: its outcome is unknown (the message says
how to look)."""
EXIT_HOST = 6
"""A host could not be reached (unreachable, key refused, no xum there, no daemon): nothing ran."""

DOMAINS = (
    "project",
    "workspace",
    "cleanup",
    "process",
    "turn",
    "events",
    "usage",
    "gc",
    "completion",
    "hosts",
    "host_install",
    "whereami",
    "mcp",
)
"""Modules under xum_client.commands that add commands, each with `register(cli)`."""


# -- --json on every command ------------------------------------------------------------------


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        obj = ctx.find_object(Ctx)
        if obj is not None:
            obj.as_json = True


def _with_json_option(command: click.Command) -> click.Command:
    """Give `command` (and, for a group, every subcommand) a `--json` flag, once."""
    if not any("--json" in getattr(p, "opts", ()) for p in command.params):
        command.params.append(
            click.Option(
                ["--json", "xum_json"],
                is_flag=True,
                expose_value=False,
                is_eager=True,
                callback=_set_json,
                help="Machine-readable output.",
            )
        )
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _with_json_option(sub)
    return command


class XumGroup(click.Group):
    """Built-in commands are defined here; domain modules load on first use (start-up time)."""

    _domains_loaded = False

    def load_domains(self) -> None:
        if self._domains_loaded:
            return
        self._domains_loaded = True
        from importlib import import_module

        for name in DOMAINS:
            try:
                module = import_module(f"xum_client.commands.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"xum_client.commands.{name}":
                    raise
                continue
            module.register(self)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None:
            self.load_domains()
            command = super().get_command(ctx, cmd_name)
        return _with_json_option(command) if command is not None else None

    def list_commands(self, ctx: click.Context) -> list[str]:
        self.load_domains()
        return super().list_commands(ctx)

    # click's own answer to a broken pipe is exit 1, an error; a reader that went away is 141
    # on every path (`commands/_stdio.py`): parsing (`--help`, `--version`) and commands.

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except BrokenPipeError as exc:
            raise _stdio.OutputGone() from exc

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            raise _stdio.OutputGone() from exc


@click.group(
    cls=XumGroup,
    epilog="Exit codes: 0 ok, 1 error, 2 usage, 3 not found, 4 no daemon, "
    "5 connection lost (outcome unknown), 6 host unreachable, 141 output's reader gone.",
)
@click.option(
    "--root",
    help="Daemon root (env XUM_ROOT; default $XDG_STATE_HOME/xum, i.e. ~/.local/state/xum).",
)
@click.option(
    "--socket",
    "socket_path",
    help="Daemon socket (env XUM_SOCKET); beats --root. The rule: --socket, --root, "
    "XUM_SOCKET, XUM_ROOT, the default root (`xum socket` shows the choice).",
)
@click.option(
    "--host",
    help="Run against the daemon on this host from the hosts file (env XUM_HOST; `xum host ls`); "
    "--root and --socket then name the host's.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--request-key",
    help="Name the command's first mutating call (letters, digits, '._:-', up to 128): the "
    "same command run again with the same key within 24 h is answered that call's outcome "
    "instead of doing it twice. Default: a new key, reused by the CLI's own retry after a "
    "lost connection.",
)
@click.version_option(CLIENT_VERSION, prog_name="xum")
@click.pass_context
def cli(
    ctx: click.Context,
    root: str | None,
    socket_path: str | None,
    host: str | None,
    *,
    as_json: bool,
    request_key: str | None,
) -> None:
    """xum: talk to the workspace lifecycle daemon (xumd)."""
    if request_key is not None:
        from xum_protocol.request_keys import problem

        why = problem(request_key)
        if why is not None:
            raise click.BadParameter(why, param_hint="--request-key")
    host = host or os.environ.get("XUM_HOST") or None
    ctx.obj = Ctx(root, as_json, socket_path, host, request_key)


@cli.command("socket")
@click.pass_obj
def socket_cmd(obj: Ctx) -> None:
    """Print the daemon socket this command line would use (--json: and how it was chosen)."""
    obj.require_local("xum socket")
    from xum_protocol.discovery import resolve_socket

    choice = resolve_socket(obj.socket, obj.root)
    obj.emit(choice.as_dict(), str(choice.path))


def _show_status(obj: Ctx, result: dict[str, Any]) -> None:
    if obj.as_json:
        obj.emit(result)
    elif sys.stdout.isatty():
        obj.table(result, ["", ""], _status_lines(result))
    else:
        click.echo(_status.plain(result), nl=False)


@cli.command()
@click.option("--all-hosts", is_flag=True, help="The local daemon and every host's, one row each.")
@host_timeout_option("connection and call")
@click.pass_obj
def status(obj: Ctx, all_hosts: bool, host_timeout: float) -> None:
    """Show the daemon's status."""
    if all_hosts:
        from xum_client.commands.allhosts_view import status_all

        status_all(obj, host_timeout)
        return
    with obj.client() as client:
        _show_status(obj, client.call("daemon.status"))


# -- xum daemon ... ---------------------------------------------------------------------------


def lock_holder(root: str) -> dict[str, Any] | None:
    """The running daemon's lock diagnostics (pid, start time), or None when none holds it."""
    import fcntl

    try:
        fd = os.open(os.path.join(root, "xumd.lock"), os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                data = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                data = {}
            return data if isinstance(data, dict) else {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@cli.group()
def daemon() -> None:
    """Run, stop, inspect and install the daemon."""


@daemon.command("run")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--socket", "socket_path", help="Socket path (for roots too deep for one).")
@click.pass_obj
def daemon_run(obj: Ctx, log_level: str | None, socket_path: str | None) -> None:
    """Run xumd in the foreground on the root (replaces this process)."""
    obj.require_local("xum daemon run")
    argv = [sys.executable, "-m", "xumd"]
    if obj.root:
        argv += ["--root", obj.root]
    if log_level:
        argv += ["--log-level", log_level]
    if socket_path or obj.socket:
        argv += ["--socket", socket_path or obj.socket or ""]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)


@daemon.command("status")
@click.pass_obj
def daemon_status(obj: Ctx) -> None:
    """The daemon's status; says why when it does not answer (exit 4)."""
    root = obj.root_path
    try:
        # Any daemon, whatever its version: this is how one learns which one runs.
        with obj.client(timeout=10, check_version=False) as client:
            result = client.call("daemon.status")
    except DaemonNotRunning as exc:
        holder = lock_holder(root)
        info: dict[str, Any] = {"running": False, "root": root, "socket": exc.socket_path}
        if holder is not None:
            # Alive (it holds the lock) but not answering: starting up, or stuck.
            info.update(running=True, answering=False, pid=holder.get("pid"))
            message = (
                f"xumd pid {holder.get('pid', '?')} holds {root} but does not answer on "
                f"{exc.socket_path} ({exc.reason})"
            )
            obj.emit(info, f"xum: {message}")
            sys.exit(EXIT_ERROR)
        obj.emit(info, f"xum: {exc}")
        sys.exit(EXIT_NO_DAEMON)
    _show_status(obj, {"running": True, **result} if obj.as_json else result)


@daemon.command("stop")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for the exit.")
@click.pass_obj
def daemon_stop(obj: Ctx, timeout: float) -> None:
    """Ask the daemon to stop gracefully and wait until it has exited."""
    # Any daemon, whatever its version: stopping an older one is how one upgrades.
    with obj.client(timeout=10, check_version=False) as client:
        status = client.call("daemon.status")
        pid = status["pid"]
        client.call("daemon.shutdown")
        remote_root = str(client.root)
    # The lock to wait on is the stopped daemon's own (its root), not the one this command
    # line would guess: `--socket` alone names no root, and the default root's lock is free.
    root = str(status.get("root") or obj.root_path)
    if obj.host is not None:
        # Its lock is on the host: the next command through the bridge starts it again.
        obj.emit(
            {"stopped": False, "stopping": True, "pid": pid, "root": remote_root, "host": obj.host},
            f"xumd pid {pid} on host {obj.host} is stopping",
        )
        return
    deadline = time.monotonic() + timeout
    while lock_holder(root) is not None:
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"xumd pid {pid} is still stopping after {timeout:.0f}s; it may be draining "
                f"(see its log), or stop it with `kill {pid}`"
            )
        time.sleep(0.05)
    obj.emit({"stopped": True, "pid": pid, "root": root}, f"xumd pid {pid} stopped")


@daemon.command("install")
@click.option("--dry-run", is_flag=True, help="Print what would be written; write nothing.")
@click.pass_obj
def daemon_install(obj: Ctx, dry_run: bool) -> None:
    """Install xumd as a user service (systemd; launchd on macOS) and print how to start it."""
    obj.require_local("xum daemon install")
    from xum_client.install import install

    # An exported XUM_ROOT is baked into the units, as --root is (the service has no shell env).
    plan = install(root=obj.root or os.environ.get("XUM_ROOT") or None, dry_run=dry_run)
    if obj.as_json:
        obj.emit(plan)
        return
    for path, text in plan["files"].items():
        if dry_run:
            click.echo(f"# {path}\n{text}")
        else:
            click.echo(f"wrote {path}")
    click.echo("\nthen run:")
    for command in plan["commands"]:
        click.echo(f"  {command}")


# -- entry point ------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    args = list(argv) if argv is not None else sys.argv[1:]
    # A closed stream or a reader that went away is an exit code, never a traceback.
    _stdio.prepare()
    _stdio.run_guarded(lambda: run(args))


def run(args: list[str]) -> None:
    """The command line on `args`, its failures reported by `fail` (the standard streams are
    the caller's business: `main`)."""
    try:
        # prog_name: usage lines, and the `_XUM_COMPLETE` variable of shell completion, say
        # `xum` however the CLI was started (`python -m`, a wrapper script).
        cli.main(args=args, prog_name="xum", standalone_mode=False)
    except (click.exceptions.Abort, click.ClickException, XumClientError) as exc:
        fail(exc, args)


def fail(exc: Exception, args: list[str]) -> NoReturn:
    """Report a failure of the command `args` and exit with its code (the fast entry,
    `xum_client.entry`, reports its failures here too, so both say the same)."""
    if isinstance(exc, click.exceptions.Abort):
        _fail(exc, EXIT_ERROR, args)
    elif isinstance(exc, click.UsageError):
        _fail(exc, EXIT_USAGE, args)
    elif isinstance(exc, click.ClickException):
        _fail(exc, exc.exit_code, args)
    elif isinstance(exc, DaemonNotRunning):
        _fail(exc, EXIT_NO_DAEMON, args)
    elif isinstance(exc, NotFound):
        _fail(exc, EXIT_NOT_FOUND, args)
    elif isinstance(exc, ConnectionLost):
        _fail(exc, EXIT_CONNECTION_LOST, args)
    elif isinstance(exc, HostError):
        _fail(exc, EXIT_HOST, args)
    _fail(exc, EXIT_ERROR, args)


def _fail(exc: Exception, code: int, args: list[str]) -> NoReturn:
    """Report `exc` (JSON on stdout with --json, else text on stderr) and exit with `code`."""
    from xum_client.commands import _errors

    # From the arguments, not from click's context: a failure leaves that behind, and a usage
    # error stops parsing before it reaches a `--json` (`xum ws bogus --json`).
    if _errors.wants_json(args):
        _errors.emit_json_error(exc, code)
        sys.exit(code)
    try:
        if isinstance(exc, click.exceptions.Abort):
            click.echo("aborted", err=True)
        elif isinstance(exc, click.UsageError):
            exc.show()  # with the command's usage line
        elif isinstance(exc, click.ClickException | XumClientError):
            click.echo(_errors.error_text(exc), err=True)
    except BrokenPipeError:
        raise  # a reader gone: 141 (commands/_stdio.py)
    except OSError:
        pass  # stderr cannot take the message (a full disk): the exit code still says it
    sys.exit(code)


__all__ = [
    "EXIT_ERROR",
    "EXIT_NOT_FOUND",
    "EXIT_NO_DAEMON",
    "Ctx",
    "cli",
    "main",
    "socket_path_for",
]


if __name__ == "__main__":
    # `python -m xum_client.cli`: the command line without the fast entry (it did nothing).
    main()
