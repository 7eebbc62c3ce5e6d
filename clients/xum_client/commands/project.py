"""`xum project add|ls|show|rm|trust`."""

from __future__ import annotations

import os

import click

from xum_client.commands._context import Ctx
from xum_client.commands._outcomes import cleanup_failed, cleanup_line
from xum_client.commands._resolve import given, project_id
from xum_client.commands.workspace import kept_line


def register(cli: click.Group) -> None:
    @cli.group()
    def project() -> None:
        """Projects: repositories registered with the daemon."""

    @project.command("add")
    @click.argument("path")
    @click.option("--name", help="display name (default: the directory's name)")
    @click.option("--workspaces-dir", help="where its workspaces go (default ROOT/workspaces/NAME)")
    @click.pass_obj
    def add(obj: Ctx, path: str, name: str | None, workspaces_dir: str | None) -> None:
        """Register the repository at PATH (with --host: an absolute path on that host)."""
        if obj.host is not None:
            # The paths are the host's: nothing here can check or complete them.
            if not os.path.isabs(path) or (workspaces_dir and not os.path.isabs(workspaces_dir)):
                raise click.UsageError(
                    f"with --host, PATH and --workspaces-dir are paths on host {obj.host}: "
                    "give them absolute"
                )
        else:
            if not os.path.isdir(path):
                why = "is a file" if os.path.exists(path) else "does not exist"
                raise click.BadParameter(f"Directory {path!r} {why}.", param_hint="'PATH'")
            path = os.path.abspath(path)
            workspaces_dir = workspaces_dir and os.path.abspath(workspaces_dir)
        params = {"path": path, **given(name=name, workspaces_dir=workspaces_dir)}
        with obj.client() as client:
            result = client.call("project.add", params)
        p = result["project"]
        obj.emit(result, f"added {p['name']} ({p['id']}) at {p['path']}")

    @project.command("ls")
    @click.pass_obj
    def ls(obj: Ctx) -> None:
        """List projects."""
        with obj.client() as client:
            result = client.call("project.list")
        lines = [
            f"{p['id']}  {p['name']:<20} {p['kind']:<9} {p['path']}" for p in result["projects"]
        ]
        obj.emit(result, "\n".join(lines) if lines else "no projects")

    @project.command("show")
    @click.argument("project_ref")
    @click.pass_obj
    def show(obj: Ctx, project_ref: str) -> None:
        """Show one project (id or name)."""
        with obj.client() as client:
            result = client.call("project.get", {"project_id": project_id(client, project_ref)})
        obj.emit(result["project"] if not obj.as_json else result, None)

    @project.command("rm")
    @click.argument("project_ref")
    @click.option("--force", is_flag=True, help="snapshot uncommitted work instead of refusing")
    @click.pass_obj
    def rm(obj: Ctx, project_ref: str, force: bool) -> None:
        """Remove every workspace of the project, then the project (never the repository)."""
        with obj.client() as client:
            pid = project_id(client, project_ref)
            result = client.call("project.remove", {"project_id": pid, "force": force})
        name = result["project"]["name"]
        # A shutdown can cut project.remove part-way: then the project stays, and each
        # workspace says whether it went.
        lines = [
            f"removed project {name} ({pid})"
            if result["removed"]
            else f"project {name} ({pid}) was NOT removed (cut short); its workspaces:"
        ]
        for ws in result["workspaces"]:
            if not ws["ok"]:
                message = (ws.get("error") or {}).get("message", "failed")
                lines.append(f"  workspace {ws['name']}: not removed: {message}")
                continue
            done = ws.get("result") or {}
            lines.append(f"  workspace {ws['name']}: removed")
            if done.get("cleanup"):
                # The same words as `xum ws rm`: a pending or failed cleanup says why.
                lines.extend("    " + part for part in cleanup_line(done["cleanup"]).split("\n"))
            if done.get("kept"):
                lines.append("    " + kept_line(done["kept"]))
        # The project still there (cut short), or a workspace's cleanup that failed.
        not_done = not result["removed"] or any(
            cleanup_failed((ws.get("result") or {}).get("cleanup")) for ws in result["workspaces"]
        )
        obj.emit_result(result, "\n".join(lines), not_done=not_done)

    @project.command("trust")
    @click.argument("project_ref")
    @click.option("--hash", "digest", help="trust exactly this config hash")
    @click.pass_obj
    def trust(obj: Ctx, project_ref: str, digest: str | None) -> None:
        """Trust the project's .xum/config.toml so its setup/teardown scripts run."""
        with obj.client() as client:
            pid = project_id(client, project_ref)
            result = client.call("project.trust", {"project_id": pid, **given(hash=digest)})
        obj.emit(result, f"trusted {result['config_path']} (sha256 {result['config_hash']})")
