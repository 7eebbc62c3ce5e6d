"""`xum ws new|ls|show|mv|archive|unarchive|rm|keep|setup|discard-kept` and `xum events`.

A workspace is addressed by its id (ws_...) or as PROJECT/NAME.
"""

from __future__ import annotations

from typing import Any

import click

from xum_client.commands._context import Ctx, host_timeout_option
from xum_client.commands._outcomes import cleanup_failed, cleanup_line, setup_failed, setup_line
from xum_client.commands._progress import SetupDisplay, by_id, by_name, setup_progress
from xum_client.commands._resolve import env_option, given, project_id, short, workspace_id
from xum_client.commands.gc import evicted_lines
from xum_client.sync import Client

LONG_TIMEOUT_S = 3600.0
"""Setup scripts and teardown run inside create/unarchive/archive/remove: wait for them (on a
terminal, setup output is shown as it comes: _progress.py)."""


def _long(obj: Ctx) -> Client:
    return obj.client(timeout=LONG_TIMEOUT_S)


def _on_workspace(obj: Ctx, method: str, ref: str, **params: Any) -> dict[str, Any]:
    """Resolve REF (id or PROJECT/NAME) and call `method` on it, waiting as long as the
    scripts that run inside the call may take."""
    with _long(obj) as client:
        return client.call(method, {"workspace_id": workspace_id(client, ref), **params})


def _setup_report(setup: dict[str, Any], ref: str, display: SetupDisplay | None) -> str:
    """The setup line, then a failed setup's output unless the display already streamed it."""
    text = setup_line(setup, ref)
    streamed = display is not None and display.streamed
    if setup.get("output") and setup["status"] != "ok" and not streamed:
        text += "\n" + setup["output"]
    return text


def _auto_archive_line(ws: dict[str, Any]) -> str:
    line = f"auto-archive: {ws['auto_archive']}"
    outcome = ws.get("auto_archive_outcome")
    if outcome:
        line += f"; last: {outcome['status']} after {outcome.get('attempts', 0)} attempt(s)"
        if outcome.get("error"):
            line += f" ({outcome['error']})"
    return line


def _raw_line(raw: list[dict[str, str]]) -> str | None:
    """The entries a snapshot cannot give back, kept as they are (None: there were none)."""
    if not raw:
        return None
    shown = ", ".join(f"{e['path']} ({e['why'].replace('_', ' ')})" for e in raw[:10])
    more = f" and {len(raw) - 10} more" if len(raw) > 10 else ""
    return f"kept as they are beside the snapshot: {shown}{more}"


def _dropped_line(dropped: dict[str, Any]) -> str:
    special = dropped.get("special") or []
    if not dropped.get("count") and not dropped.get("preserved") and not special:
        return "dropped: no ignored files"
    if not dropped.get("count"):
        line = "dropped: 0 ignored files"  # but preserved or special ones, named below
    else:
        line = f"dropped: {dropped['count']} ignored file(s), {dropped['bytes']} bytes"
    if dropped.get("count") and dropped.get("paths"):
        line += " in " + ", ".join(dropped["paths"][:10])
    if dropped.get("preserved"):
        kept = dropped["preserved"]
        line += f"; preserved {len(kept)}: " + ", ".join(kept[:10])
        if len(kept) > 10:
            line += f" (+{len(kept) - 10} more)"
    if special:
        # FIFOs, sockets, devices: no archive can hold them; they go with the checkout.
        line += f"; {len(special)} special file(s) not saved: " + ", ".join(
            f"{s['path']} ({s['type']})" for s in special[:10]
        )
    return line


def _create_extras(result: dict[str, Any]) -> str:
    """What gc collected to make room, the warm pool's outcome, the base fetch, the sparse cone
    and the submodules of a create, when there were any."""
    lines = evicted_lines(result.get("evicted") or [])
    if result.get("pool") is not None:
        made = result.get("materialised") or "unknown"
        lines.append(f"pool: {result['pool']} (checkout: {made})")
    fetched = result.get("fetch")
    if fetched:
        line = f"fetch: {fetched['status']} from {fetched['remote']}"
        if fetched.get("stale"):
            line += f"; STALE base used ({fetched.get('error')})"
        lines.append(line)
    if fetched and result.get("base_commit"):
        lines.append(f"base: {result['base_commit']}")
    sparse = result.get("sparse")
    if sparse:
        lines.append("sparse: " + " ".join(sparse["patterns"]))
    for sub in result.get("submodules") or []:
        error = f" ({sub['error']})" if sub.get("error") else ""
        lines.append(f"submodule {sub['path']}: {sub['status']}{error}")
    carried = result.get("carried")
    if carried:
        lines.append(_carried_line(carried))
    return "\n".join(lines)


def _carried_line(carried: dict[str, Any]) -> str:
    """What `--carry` took from the main checkout, and what `move` left there."""
    line = (
        f"carried {len(carried['files'])} path(s) from the main checkout "
        f"({len(carried['staged'])} staged, {len(carried['untracked'])} untracked)"
    )
    if carried["mode"] == "move" and carried.get("moved"):
        line += "; moved out of the main checkout"
    for left in carried.get("left") or []:
        line += f"\n  left in the main checkout: {left['path']} ({left['reason']})"
    return line


def _env(pairs: tuple[str, ...]) -> dict[str, str]:
    env = env_option(pairs)
    for name in env:
        if name.upper().startswith("XUM_"):
            # The daemon refuses it too (invalid_params); said here in words.
            raise click.BadParameter(
                f"{name} is reserved: XUM_* variables are set by the daemon and cannot be "
                "overridden",
                param_hint="--env",
            )
    return env


def _ports_line(ws: dict[str, Any]) -> str:
    ports = ws["ports"]
    line = f"ports: {', '.join(str(p) for p in ports)} (XUM_PORT={ports[0]})"
    named = ws.get("named_ports") or {}
    if named:
        line += "; " + ", ".join(f"{name}={port}" for name, port in named.items())
    return line


def _taken_line(taken: dict[str, Any], ref: str) -> str:
    """A port of the workspace that a process outside it holds (workspace.get's ports_taken)."""
    who = f"pid {taken['pid']}" if taken.get("pid") is not None else "another user's process"
    if taken.get("command"):
        who += f" ({taken['command']})"
    name = f" ({taken['name']})" if taken.get("name") else ""
    return (
        f"port {taken['port']}{name} is taken by {who}: `xum ws ports {ref} --reallocate` "
        "gives the workspace a free one"
    )


def copy_line(copied: dict[str, Any]) -> str:
    """What the copy of ignored files did (create, unarchive)."""
    line = (
        f"copied ignored files: {copied['files']} file(s), {copied['bytes']} bytes "
        f"({copied['cloned']} cloned, {copied['copied']} copied) in {copied['elapsed_s']:.2f}s"
    )
    if copied.get("paths"):
        line += ": " + ", ".join(copied["paths"][:10])
    if copied.get("status") == "capped":
        line += (
            f"\n  stopped at the size cap ({copied['limit_bytes']} bytes): not copied: "
            + ", ".join(copied.get("skipped", [])[:10])
        )
    for key, what in (("special", "not copied (special)"), ("mounts", "not entered (mount)")):
        if copied.get(key):
            line += f"\n  {what}: " + ", ".join(copied[key][:10])
    return line


def kept_line(kept: dict[str, Any]) -> str:
    """Where a removed workspace's preserved files are kept, and how to find or drop them."""
    return (
        f"kept {len(kept['files'])} preserved file(s) at {kept['path']} "
        "(`xum ws strays`; `xum ws discard-kept PATH` deletes them)"
    )


def register(cli: click.Group) -> None:
    @cli.group("ws")
    def ws() -> None:
        """Workspaces (address them as ws_... or PROJECT/NAME)."""

    from xum_client.commands.getting_in import register_into

    register_into(ws)

    @ws.command("new")
    @click.argument("project_ref")
    @click.argument("name")
    @click.option("--branch", help="branch to create or check out (default xum/NAME)")
    @click.option("--base", help="commit to branch from (default: the repository's HEAD)")
    @click.option("--runtime", type=click.Choice(["worktree", "directory"]), default="worktree")
    @click.option(
        "--auto-archive",
        type=click.Choice(["on_agent_exit"]),
        help="archive it when its agent exits with 0",
    )
    @click.option(
        "--fetch/--no-fetch",
        default=None,
        help="fetch the base's remote first (default: the project's [create] fetch)",
    )
    @click.option(
        "--allow-stale-base", is_flag=True, help="with --fetch: if the fetch fails, go on anyway"
    )
    @click.option(
        "--env",
        "env_pairs",
        multiple=True,
        metavar="NAME=VALUE",
        help="an environment variable for its setup, teardown and processes (repeatable)",
    )
    @click.option(
        "--carry",
        type=click.Choice(["copy", "move"]),
        help="take the main checkout's uncommitted changes into it (move: and out of the main "
        "checkout once the new one holds them)",
    )
    @click.pass_obj
    def new(  # noqa: PLR0917 - one parameter per click option
        obj: Ctx,
        project_ref: str,
        name: str,
        branch: str | None,
        base: str | None,
        runtime: str,
        auto_archive: str | None,
        fetch: bool | None,
        allow_stale_base: bool,
        env_pairs: tuple[str, ...],
        carry: str | None,
    ) -> None:
        """Create workspace NAME in PROJECT."""
        env = _env(env_pairs)  # bad input is a usage error, daemon or not
        with _long(obj) as client:
            pid = project_id(client, project_ref)
            params = {
                "project_id": pid,
                "name": name,
                "runtime": runtime,
                **given(branch=branch, base=base, auto_archive=auto_archive, env=env, carry=carry),
            }
            if fetch is not None:  # --no-fetch overrides the project's [create] fetch
                params["fetch"] = fetch
            if allow_stale_base:
                params["allow_stale_base"] = True
            with setup_progress(obj, by_name(pid, name), f"creating {name}") as display:
                result = client.call("workspace.create", params)
        w = result["workspace"]
        human = f"created {w['name']} ({w['id']}) at {w['path']}"
        if w.get("ports"):
            human += f"\n{_ports_line(w)}"
        copied = result.get("ignored_copy") or {}
        if copied.get("status", "none") != "none":
            human += f"\n{copy_line(copied)}"
        extras = _create_extras(result)
        if extras:
            human += "\n" + extras
        human += "\n" + _setup_report(result["setup"], f"{project_ref}/{name}", display)
        obj.emit_result(result, human, not_done=setup_failed(result))

    @ws.command("ls")
    @click.option("--project", "project_ref", help="only this project (id or name)")
    @click.option("--state", help="only this state")
    @click.option("--usage", "with_usage", is_flag=True, help="with each checkout's disk usage")
    @click.option(
        "--limit",
        type=click.IntRange(1, 10_000),
        help="at most N workspaces (one page; its `next` continues with --after)",
    )
    @click.option("--after", help="the `next` cursor of a previous --limit listing")
    @click.option("--all-hosts", is_flag=True, help="the local daemon's and every host's")
    @host_timeout_option("connection and call")
    @click.pass_obj
    def ls(
        obj: Ctx,
        *,
        project_ref: str | None,
        state: str | None,
        with_usage: bool,
        limit: int | None,
        after: str | None,
        all_hosts: bool,
        host_timeout: float,
    ) -> None:
        """List workspaces (all of them, fetched a page at a time; --limit: one page)."""
        from xum_client.commands.listing import list_workspaces

        if all_hosts:
            if with_usage or limit is not None or after is not None:
                raise click.UsageError("--usage, --limit and --after do not go with --all-hosts")
            from xum_client.commands.allhosts_view import ws_ls_all

            ws_ls_all(obj, project_ref, state, host_timeout)
            return
        with obj.client() as client:
            pid = project_id(client, project_ref) if project_ref else None
            result = list_workspaces(client, given(project_id=pid, state=state), limit, after)
        lines = [short(w) for w in result["workspaces"]]
        if with_usage:
            from xum_client.commands.usage import fetch_usage, usage_cell

            sizes = {u["workspace_id"]: u for u in fetch_usage(obj)["workspaces"]}
            result["usage"] = [sizes[w["id"]] for w in result["workspaces"] if w["id"] in sizes]
            lines = [
                f"{usage_cell(sizes.get(w['id'], {})):>12}  {line}"
                for w, line in zip(result["workspaces"], lines, strict=True)
            ]
        if result.get("next"):
            lines.append(f"(more: --after {result['next']})")
        obj.emit(result, "\n".join(lines) if lines else "no workspaces")

    @ws.command("show")
    @click.argument("ref")
    @click.pass_obj
    def show(obj: Ctx, ref: str) -> None:
        """Show one workspace, with its setup output and last cleanup."""
        with obj.client() as client:
            result = client.call("workspace.get", {"workspace_id": workspace_id(client, ref)})
        w = result["workspace"]
        human = [short(w)]
        if w.get("interrupted"):
            reason = w.get("interrupted_reason") or "no reason recorded"
            human.append(f"interrupted: {reason}\n  keep it (`xum ws keep {ref}`) or remove it")
        human.append(setup_line(w["setup"], ref))
        if w["setup"].get("output"):
            human.append(w["setup"]["output"].rstrip())
        if w.get("snapshot"):
            human.append(f"snapshot: {w['snapshot']['ref']} {w['snapshot']['commit']}")
        if w.get("last_cleanup"):
            human.append(cleanup_line(w["last_cleanup"]))
        if w.get("auto_archive"):
            human.append(_auto_archive_line(w))
        if w.get("ports"):
            human.append(_ports_line(w))
        human.extend(_taken_line(taken, ref) for taken in result.get("ports_taken") or [])
        if w.get("env"):
            human.append("env: " + " ".join(sorted(w["env"])))
        obj.emit(result, "\n".join(human))

    @ws.command("ports")
    @click.argument("ref")
    @click.option(
        "--reallocate",
        "reallocate",
        is_flag=True,
        help="replace the ports a process outside the workspace took by free ones",
    )
    @click.option(
        "--port",
        "chosen",
        type=int,
        multiple=True,
        help="with --reallocate: replace this port of the workspace (repeatable)",
    )
    @click.pass_obj
    def ports_cmd(obj: Ctx, ref: str, reallocate: bool, chosen: tuple[int, ...]) -> None:
        """Show a workspace's ports (named ones by name, taken ones with who holds them), or
        replace them (--reallocate): names and positions are kept; its running processes keep
        the ports they started with."""
        if chosen and not reallocate:
            raise click.UsageError("--port needs --reallocate")
        with obj.client() as client:
            wid = workspace_id(client, ref)
            if reallocate:
                params: dict[str, Any] = {"workspace_id": wid}
                if chosen:
                    params["ports"] = list(chosen)
                result = client.call("workspace.reallocate_ports", params)
                changes = result["changes"]
                lines = [f"port {c['old']} -> {c['new']}" for c in changes] or [
                    "no port to replace: none is taken by a process outside the workspace"
                ]
                if changes:
                    lines.append("running processes keep the ports they started with")
                obj.emit(result, "\n".join(lines))
                return
            result = client.call("workspace.get", {"workspace_id": wid})
        w = result["workspace"]
        lines = [_ports_line(w)] if w.get("ports") else ["no ports"]
        lines.extend(_taken_line(taken, ref) for taken in result.get("ports_taken") or [])
        obj.emit(result, "\n".join(lines))

    @ws.command("mv")
    @click.argument("ref")
    @click.argument("new_name")
    @click.pass_obj
    def mv(obj: Ctx, ref: str, new_name: str) -> None:
        """Rename a workspace (moves its checkout; renames a default xum/ branch)."""
        result = _on_workspace(obj, "workspace.rename", ref, name=new_name)
        w = result["workspace"]
        obj.emit(result, f"renamed {result['previous_name']} -> {w['name']} at {w['path']}")

    @ws.command("archive")
    @click.argument("ref")
    @click.option("--stop", is_flag=True, help="stop the daemon's processes in it first")
    @click.pass_obj
    def archive(obj: Ctx, ref: str, stop: bool) -> None:
        """Snapshot uncommitted work, archive, and delete the checkout (branch kept)."""
        result = _on_workspace(obj, "workspace.archive", ref, stop=stop)
        snap = result["snapshot"]
        lines = [
            f"archived {result['workspace']['name']}",
            f"snapshot: {snap['ref']} ({len(snap['files'])} file(s))"
            if snap
            else "snapshot: none (no uncommitted work)",
            _dropped_line(result["dropped"]),
            cleanup_line(result["cleanup"]),
        ]
        raw = _raw_line(result.get("raw") or [])
        if raw:
            lines.insert(2, raw)
        if stop:
            stopped = result.get("stopped") or []
            lines.insert(1, "stopped: " + (", ".join(stopped) if stopped else "nothing running"))
        obj.emit_result(result, "\n".join(lines), not_done=cleanup_failed(result["cleanup"]))

    @ws.command("unarchive")
    @click.argument("ref")
    @click.pass_obj
    def unarchive(obj: Ctx, ref: str) -> None:
        """Recreate the checkout and restore its snapshot."""
        with _long(obj) as client:
            wid = workspace_id(client, ref)
            with setup_progress(obj, by_id(wid), f"restoring {ref}"):
                result = client.call("workspace.unarchive", {"workspace_id": wid})
        w = result["workspace"]
        restored = result["restored"]
        files = len((restored.get("snapshot") or {}).get("files", []))
        human = (
            f"restored {w['name']} at {w['path']} ({files} file(s) from the snapshot, "
            f"{len(restored['preserved'])} preserved)\n{setup_line(result['setup'], ref)}"
        )
        for line in evicted_lines(result.get("evicted") or []):
            human += f"\n{line}"
        if restored.get("raw"):
            human += "\nwritten back as they were kept: " + ", ".join(restored["raw"][:10])
        if restored.get("replaced"):
            human += "\nyour preserved copy replaced what setup wrote: " + ", ".join(
                restored["replaced"]
            )
        if restored.get("sparse"):
            human += "\nsparse: " + " ".join(restored["sparse"]["patterns"])
        if restored.get("sparse_kept"):
            human += "\nkept outside the archived cone (their directories added): " + ", ".join(
                restored["sparse_kept"]
            )
        copied = result.get("ignored_copy") or {}
        if copied.get("status", "none") != "none":
            human += f"\n{copy_line(copied)}"
        for change in result.get("ports_replaced") or []:
            human += f"\nport {change['old']} was taken meanwhile: now {change['new']}"
        if restored.get("kept_at"):
            human += (
                f"\nnot in place: {', '.join(restored.get('unverified') or [])}; "
                f"your saved copy is kept at {restored['kept_at']}"
            )
        not_done = setup_failed(result) or bool(restored.get("kept_at"))
        obj.emit_result(result, human, not_done=not_done)

    @ws.command("rm")
    @click.argument("ref")
    @click.option(
        "--force",
        is_flag=True,
        help="snapshot uncommitted work and keep preserved files instead of refusing",
    )
    @click.pass_obj
    def rm(obj: Ctx, ref: str, force: bool) -> None:
        """Remove a workspace (branch and snapshots are kept)."""
        result = _on_workspace(obj, "workspace.remove", ref, force=force)
        lines = [f"removed {result['workspace_id']} (branch {result['branch'] or '-'} kept)"]
        if result["snapshot"]:
            lines.append(f"snapshot: {result['snapshot']['ref']}")
        if result.get("kept"):
            lines.append(kept_line(result["kept"]))
        raw = _raw_line(result.get("raw") or [])
        if raw:
            lines.append(raw.replace("beside the snapshot", "in the kept copy"))
        lines.append(cleanup_line(result["cleanup"]))
        obj.emit_result(result, "\n".join(lines), not_done=cleanup_failed(result["cleanup"]))

    @ws.command("setup")
    @click.argument("ref")
    @click.pass_obj
    def setup(obj: Ctx, ref: str) -> None:
        """Run an active workspace's setup again (e.g. after `xum project trust`)."""
        with _long(obj) as client:
            wid = workspace_id(client, ref)
            with setup_progress(obj, by_id(wid), f"setting up {ref}") as display:
                result = client.call("workspace.setup", {"workspace_id": wid})
        w = result["workspace"]
        human = f"{w['name']} ({w['id']})\n" + _setup_report(result["setup"], ref, display)
        # Untrusted too: running the setup is all this command is for, and it did not run.
        untrusted = result["setup"]["status"] == "untrusted"
        obj.emit_result(result, human, not_done=setup_failed(result) or untrusted)

    @ws.command("discard-kept")
    @click.argument("path")
    @click.pass_obj
    def discard_kept(obj: Ctx, path: str) -> None:
        """Delete a kept copy of preserved files (a `kept` stray: `xum ws strays`)."""
        with obj.client() as client:
            result = client.call("workspace.discard_kept", {"path": path})
        obj.emit(result, f"deleted {result['path']} ({result['files']} file(s))")

    @ws.command("keep")
    @click.argument("ref")
    @click.pass_obj
    def keep(obj: Ctx, ref: str) -> None:
        """Keep an interrupted workspace (it becomes active)."""
        result = _on_workspace(obj, "workspace.keep", ref)
        obj.emit(result, f"kept {result['workspace']['name']}: {result['workspace']['state']}")

    @ws.command("strays")
    @click.option("--project", "project_ref", help="only this project (id or name)")
    @click.pass_obj
    def strays(obj: Ctx, project_ref: str | None) -> None:
        """Checkouts under the root that no workspace claims (never deleted by xumd)."""
        from xum_client.commands.turn import show_strays

        show_strays(obj, project_ref)
