"""`xum run`, `xum term`, `xum ps`, `xum kill`, `xum lease ls`: supervised processes and leases.

`run` and `term` attach: the process is spawned in the foreground of this connection (the daemon
stops it if the CLI goes away), its output is streamed by long-polling `process.output`, and
stdin goes to `process.write` over a second connection (one request at a time per connection).
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import sys
import threading
from typing import Any

import click

from xum_client.commands._outcomes import leftovers_line
from xum_client.commands._resolve import env_option
from xum_client.errors import ConnectionLost, XumClientError, XumRpcError
from xum_client.sync import Client

POLL_S = 5.0


def _obj(ctx: click.Context) -> Any:
    return ctx.find_root().obj


def resolve_workspace(client: Client, ref: str) -> str:
    """A workspace id, or a unique workspace name (`name` or `project/name`)."""
    if ref.startswith("ws_"):
        return ref
    found = client.call("workspace.list", {})["workspaces"]
    project_name, _, name = ref.rpartition("/")
    matches = [w for w in found if w["name"] == name]
    if project_name:
        projects = {p["id"]: p["name"] for p in client.call("project.list", {})["projects"]}
        matches = [w for w in matches if projects.get(w["project_id"]) == project_name]
    if len(matches) != 1:
        what = "no workspace" if not matches else f"{len(matches)} workspaces"
        raise click.ClickException(f"{what} named {ref!r}; use the id or project/name")
    workspace_id: str = matches[0]["id"]
    return workspace_id


def exit_status(exit_info: dict[str, Any] | None) -> int:
    if not exit_info:
        return 1
    if exit_info.get("code") is not None:
        return int(exit_info["code"])
    sig = exit_info.get("signal")
    if sig:
        with contextlib.suppress(KeyError):
            return 128 + int(signal.Signals[sig])
    return 1


class _Side:
    """The second connection: stdin, signals and resizes, serialised by a lock."""

    def __init__(self, client: Client, process_id: str) -> None:
        self.client = client
        self.process_id = process_id
        self.lock = threading.Lock()

    def call(self, method: str, **params: Any) -> None:
        with self.lock, contextlib.suppress(XumRpcError, ConnectionLost, OSError):
            self.client.call(method, {"process_id": self.process_id, **params})

    def pump(self, raw: bool) -> None:
        """Forward stdin until EOF (daemon thread: it dies with the CLI)."""
        fd = sys.stdin.fileno()
        while True:
            try:
                data = os.read(fd, 4096)
            except OSError:
                return
            if not data:
                if not raw:
                    self.call("process.write", data="", eof=True)
                return
            self.call("process.write", data=base64.b64encode(data).decode(), encoding="base64")


class DaemonStopping(click.ClickException):
    exit_code = 75  # EX_TEMPFAIL: the command did not finish here; see the message
    kind = "daemon_stopping"  # its `--json` error kind


def daemon_stop_note(process: dict[str, Any]) -> str:
    """What happens to `process` now that the daemon stops (its `on_daemon_stop`)."""
    if process.get("on_daemon_stop") == "keep":
        return (
            f"the daemon is stopping; {process['kind']} {process['id']} keeps running and is "
            "adopted at the next start (`xum ps`; its output continues in `process.output`)"
        )
    why = (
        "terminals never outlive the daemon"
        if process.get("kind") == "terminal"
        else "only agents and MCP servers without a PTY are kept, with keep_processes"
    )
    return f"the daemon is stopping; {process['kind']} {process['id']} is stopped ({why})"


def _stream(client: Client, process: dict[str, Any], obj: Any) -> dict[str, Any] | None:
    """Copy the output to stdout until the process exited and everything was read."""
    try:
        return _copy_output(client, process["id"])
    except (ConnectionLost, XumRpcError) as exc:
        if isinstance(exc, XumRpcError) and exc.kind != "shutting_down":
            raise
        if isinstance(exc, ConnectionLost) and exc.host is not None and exc.status != 0:
            # The link to the host ended (ssh killed or failed, the host gone), not the host's
            # daemon: status 0 alone is the bridge ending because its daemon closed.
            raise link_lost(exc, process, obj) from None
        raise DaemonStopping(daemon_stop_note(process)) from None


SETTLE_S = 5.0
"""How long the look after a lost link waits for a foreground run to end: its daemon stops it
once it sees the run's connection close, which may be a moment after ssh here ended."""


def link_lost(exc: ConnectionLost, process: dict[str, Any], obj: Any) -> ConnectionLost:
    """The link to the host ended while following `process`: where, why (ssh's status), and
    whether the process still runs there, asked of the host's daemon over a new connection."""
    from xum_client.sshlink import why_lost

    host, process_id = exc.host, process["id"]
    running: bool | None = None
    try:
        with obj.client(timeout=SETTLE_S + 30.0, client_name="xum-cli-look") as probe:
            found = probe.call("process.get", {"process_id": process_id})["process"]
            if found["state"] != "exited" and found.get("foreground"):
                found = probe.call(
                    "process.wait", {"process_id": process_id, "timeout_s": SETTLE_S}
                )["process"]
    except (XumClientError, OSError) as look_exc:
        kind = getattr(look_exc, "kind", None) or "error"
        now = (
            f"whether {process_id} still runs there is not known (looking failed: {kind}); "
            f"look with `xum --host {host} ps --all`"
        )
    else:
        running = found["state"] != "exited"
        if running:
            now = (
                f"{process_id} is still running there; see it with `xum --host {host} ps`, "
                f"stop it with `xum --host {host} kill {process_id}`"
            )
        else:
            reason = (found.get("exit") or {}).get("stop_reason")
            how = "it exited"
            if reason:
                how = STOP_NOTES.get(reason, f"stopped by the daemon ({reason})")
            now = (
                f"{process_id} is no longer running there ({how.format(id=process_id)}); "
                f"see it with `xum --host {host} ps --all`"
            )
    return ConnectionLost(
        f"connection to host {host!r} lost while following {process_id} "
        f"({why_lost(exc.status, exc.detail)}): {now}",
        host=host,
        method=exc.method,
        sent=exc.sent,
        status=exc.status,
        detail=exc.detail,
        extra={"process_id": process_id, "running": running},
    )


def _copy_output(client: Client, process_id: str) -> dict[str, Any] | None:
    since = 0
    out = sys.stdout.buffer
    while True:
        chunk = client.call(
            "process.output",
            {"process_id": process_id, "since": since, "wait_s": POLL_S, "encoding": "base64"},
        )
        if chunk["dropped"]:
            sys.stderr.write(f"\n[xum: {chunk['dropped']} bytes of output were dropped]\n")
        data = base64.b64decode(chunk["data"])
        if data:
            out.write(data)
            out.flush()
        since = chunk["next"]
        if chunk["exited"]:
            exit_info: dict[str, Any] | None = chunk["exit"]
            note = stop_note(process_id, exit_info)
            if note:
                sys.stderr.write(f"\n[xum: {note}]\n")
            left = leftovers_line(process_id, (exit_info or {}).get("leftovers"))
            if left:
                sys.stderr.write(f"[xum: {left}]\n")
            return exit_info


STOP_NOTES = {
    "shutdown": "stopped because the daemon shut down",
    "release": "stopped by the daemon: its workspace was archived with --stop (or released)",
    "request": "stopped by a request to stop it (`xum kill {id}` or process.stop)",
    "session": "stopped because its caller's connection closed",
}


def stop_note(process_id: str, exit_info: dict[str, Any] | None) -> str | None:
    """Why the daemon stopped an attached process (None: it ended on its own): an `xum run`
    that ends by SIGTERM says who sent it instead of exiting 143 silently."""
    reason = (exit_info or {}).get("stop_reason")
    if not reason:
        return None
    note = STOP_NOTES.get(reason, f"stopped by the daemon ({reason})")
    return f"{process_id} " + note.format(id=process_id)


def register(cli: click.Group) -> None:
    @cli.command(context_settings={"ignore_unknown_options": True})
    @click.argument("workspace")
    @click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
    @click.option("--kind", type=click.Choice(["exec", "agent", "mcp"]), default="exec")
    @click.option("--env", "env_pairs", multiple=True, help="KEY=VALUE (repeatable)")
    @click.option(
        "--detach",
        "-d",
        is_flag=True,
        help="start it and return at once, printing its id (`xum ps`; `xum kill ID` stops it)",
    )
    @click.pass_context
    def run(  # noqa: PLR0917 - one parameter per click option
        ctx: click.Context,
        workspace: str,
        argv: tuple[str, ...],
        kind: str,
        env_pairs: tuple[str, ...],
        detach: bool,
    ) -> None:
        """Run a command in a workspace: stream its output, forward stdin, exit with its code.

        xum run WS -- make test
        xum run --detach --kind agent WS -- my-agent   # prints proc_..., returns
        """
        obj = _obj(ctx)
        env = env_option(env_pairs) or None  # bad input is a usage error, daemon or not
        with obj.client() as client:
            ws = resolve_workspace(client, workspace)
            process = client.call(
                "process.spawn",
                {
                    "workspace_id": ws,
                    "kind": kind,
                    "argv": list(argv),
                    "env": env,
                    # Detached: not tied to this connection, so it outlives this command.
                    "foreground": kind == "exec" and not detach,
                },
            )["process"]
            if detach:
                obj.emit({"process": process}, process["id"])
                return
            side = _Side(obj.client(client_name="xum-cli-input"), process["id"])
            threading.Thread(target=side.pump, args=(False,), daemon=True).start()
            previous = signal.signal(
                signal.SIGINT, lambda *_: side.call("process.signal", signal="INT")
            )
            try:
                exit_info = _stream(client, process, obj)
            finally:
                signal.signal(signal.SIGINT, previous)
        sys.exit(exit_status(exit_info))

    @cli.command()
    @click.argument("workspace")
    @click.option("--shell", default=None, help="default: $SHELL, else /bin/sh")
    @click.pass_context
    def term(ctx: click.Context, workspace: str, shell: str | None) -> None:
        """An interactive terminal (PTY) in a workspace."""
        import termios
        import tty

        obj = _obj(ctx)
        if not sys.stdin.isatty():
            raise click.ClickException("xum term needs a terminal on stdin")
        size = os.get_terminal_size()
        with obj.client() as client:
            ws = resolve_workspace(client, workspace)
            process = client.call(
                "process.spawn",
                {
                    "workspace_id": ws,
                    "kind": "terminal",
                    "argv": [shell or os.environ.get("SHELL") or "/bin/sh"],
                    "pty": True,
                    "cols": size.columns or 80,
                    "rows": size.lines or 24,
                    "foreground": True,
                },
            )["process"]
            side = _Side(obj.client(client_name="xum-cli-input"), process["id"])

            def on_winch(*_: Any) -> None:
                now = os.get_terminal_size()
                side.call("process.resize", cols=now.columns or 80, rows=now.lines or 24)

            saved = termios.tcgetattr(sys.stdin.fileno())
            previous = signal.signal(signal.SIGWINCH, on_winch)
            try:
                # TCSANOW: keep what the user typed ahead (TCSAFLUSH would discard it).
                tty.setraw(sys.stdin.fileno(), termios.TCSANOW)
                threading.Thread(target=side.pump, args=(True,), daemon=True).start()
                exit_info = _stream(client, process, obj)
            finally:
                termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)
                signal.signal(signal.SIGWINCH, previous)
        sys.exit(exit_status(exit_info))

    @cli.command()
    @click.argument("workspace", required=False)
    @click.option("--all", "show_all", is_flag=True, help="include exited processes")
    @click.pass_context
    def ps(ctx: click.Context, workspace: str | None, show_all: bool) -> None:
        """Supervised processes (of one workspace, or all)."""
        obj = _obj(ctx)
        with obj.client() as client:
            params = {"workspace_id": resolve_workspace(client, workspace)} if workspace else {}
            found = client.call("process.list", params)["processes"]
        found = [p for p in found if show_all or p["state"] != "exited"]
        # ON STOP: what a daemon stop does to it (keep: left running, adopted at the next start).
        lines = [
            f"{'ID':22} {'WORKSPACE':22} {'KIND':9} {'PID':>7} {'STATE':19} {'ON STOP':7} COMMAND"
        ]
        for p in found:
            state = p["state"] + (" (adopted)" if p["adopted"] else "")
            lines.append(
                f"{p['id']:22} {p['workspace_id']:22} {p['kind']:9} {p['pid'] or '-':>7} "
                f"{state:19} {p.get('on_daemon_stop', 'stop'):7} {' '.join(p['argv'])}"
            )
        # An exit that stopped what the process left running says so (never a silent stop).
        for p in found:
            left = leftovers_line(p["id"], (p.get("exit") or {}).get("leftovers"))
            if left:
                lines.append(left)
        obj.emit({"processes": found}, "\n".join(lines))

    @cli.command()
    @click.argument("process_id")
    @click.option(
        "--signal", "-s", "sig", default=None, help="send this signal instead of stopping"
    )
    @click.option("--grace", type=float, default=None, help="seconds between SIGTERM and SIGKILL")
    @click.pass_context
    def kill(ctx: click.Context, process_id: str, sig: str | None, grace: float | None) -> None:
        """Stop a process (SIGTERM, grace, SIGKILL of its tree), or send it a signal."""
        obj = _obj(ctx)
        with obj.client() as client:
            if sig:
                result = client.call("process.signal", {"process_id": process_id, "signal": sig})
            else:
                params: dict[str, Any] = {"process_id": process_id}
                if grace is not None:
                    params["grace_s"] = grace
                result = client.call("process.stop", params)
        p = result["process"]
        obj.emit(result, f"{p['id']} {p['state']}" + (f" {p['exit']}" if p.get("exit") else ""))

    @cli.group()
    def lease() -> None:
        """Use leases on workspaces."""

    @lease.command("ls")
    @click.argument("workspace", required=False)
    @click.pass_context
    def lease_ls(ctx: click.Context, workspace: str | None) -> None:
        """Live leases (dead holders' leases are reclaimed on the way)."""
        obj = _obj(ctx)
        with obj.client() as client:
            params = {"workspace_id": resolve_workspace(client, workspace)} if workspace else {}
            result = client.call("lease.list", params)
        lines = [f"{'ID':23} {'WORKSPACE':22} {'KIND':10} {'PID':>7} LABEL"]
        for x in result["leases"]:
            lines.append(
                f"{x['id']:23} {x['workspace_id']:22} {x['kind']:10} {x['pid'] or '-':>7} "
                f"{x['label']}"
            )
        obj.emit(result, "\n".join(lines))
