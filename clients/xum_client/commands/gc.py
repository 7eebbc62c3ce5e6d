"""`xum gc [--dry-run]`: collect what the gc policies of ROOT/config.toml select (all off by
default): archived workspaces past their age, snapshot refs of removed workspaces, clean merged
workspaces, kept copies. On a terminal each item is shown as it is collected."""

from __future__ import annotations

import sys
from typing import Any

import click

from xum_client.commands._context import Ctx
from xum_client.commands.usage import budget_lines, human_bytes
from xum_client.sync import Client

GC_TIMEOUT_S = 3600.0
"""Each item is a lifecycle operation (archive runs teardown, remove snapshots): wait for it."""


def _subject(item: dict[str, Any]) -> str:
    return str(item.get("name") or item.get("ref") or item.get("workspace_id") or item["key"])


def evicted_lines(evicted: list[dict[str, Any]]) -> list[str]:
    """What gc collected to make room for a create or an unarchive (their `evicted`)."""
    return [f"made room: {d['action']} {_subject(d)} ({human_bytes(d['bytes'])})" for d in evicted]


def _policy_line(policies: dict[str, Any]) -> str:
    on = [f"{k}={v}" for k, v in policies.items() if v not in (None, False, 0)]
    return "policies: " + (", ".join(on) if on else "none enabled (ROOT/config.toml [gc])")


def register(cli: click.Group) -> None:
    @cli.command("gc")
    @click.option("--dry-run", is_flag=True, help="only show what would be collected")
    @click.option(
        "--background",
        is_flag=True,
        help="let the daemon collect in the background (resumed after a restart); "
        "prints the run id (`xum gc --status RUN`)",
    )
    @click.option("--status", "run_id", help="the result of a background run")
    @click.pass_obj
    def gc(obj: Ctx, dry_run: bool, background: bool, run_id: str | None) -> None:
        """Collect stale workspaces, snapshot refs and kept copies (policies: [gc] in the
        daemon's config.toml); anything busy or holding unsaved work is skipped."""
        with obj.client(timeout=GC_TIMEOUT_S) as client:
            if run_id is not None:
                got = client.call("gc.get", {"run_id": run_id})
                obj.emit(got, _run_summary(got))
                return
            if background:
                started = client.call("gc.run", {"background": True})
                obj.emit(started, f"gc run {started['run_id']} started in the background")
                return
            plan = client.call("gc.plan", {})
            if dry_run:
                _show_plan(obj, plan)
            elif obj.as_json:  # one answer, no progress lines
                obj.emit(client.call("gc.run", {"keys": [i["key"] for i in plan["items"]]}))
            else:
                _run(obj, client, plan)


def _run_summary(result: dict[str, Any]) -> str:
    if result["state"] != "done":
        return f"gc run {result['run_id']}: running"
    lines = [f"{d['action']} {_subject(d)}: done ({d['detail']})" for d in result["done"]]
    lines += [f"{s['action']} {_subject(s)}: skipped ({s['reason']})" for s in result["skipped"]]
    lines.append(
        f"{len(result['done'])} collected, {len(result['skipped'])} skipped, "
        f"{human_bytes(result['bytes'])} freed"
    )
    return "\n".join(lines)


def _show_plan(obj: Ctx, plan: dict[str, Any]) -> None:
    lines = [_policy_line(plan["policies"])]
    for item in plan["items"]:
        lines.append(
            f"would {item['action']}: {_subject(item)} ({human_bytes(item['bytes'])}; "
            f"{item['reason']})"
        )
    for skip in plan["skipped"]:
        lines.append(f"skip {skip['action']}: {_subject(skip)} ({skip['reason']})")
    lines.append(f"{len(plan['items'])} item(s), {human_bytes(plan['bytes'])} freed")
    lines += budget_lines(plan.get("budget") or [])
    if plan.get("unmet_bytes"):
        lines.append(
            f"the budget cannot be met: {human_bytes(plan['unmet_bytes'])} more is held by busy "
            "or unsaved work, or is not rebuildable"
        )
    obj.emit(plan, "\n".join(lines))


def _run(obj: Ctx, client: Client, plan: dict[str, Any]) -> None:
    """One `gc.run` per item, so a terminal shows each as it is done."""
    items = plan["items"]
    click.echo(_policy_line(plan["policies"]))
    done = 0
    freed = 0
    skipped = list(plan["skipped"])
    progress = sys.stdout.isatty()
    for index, item in enumerate(items, 1):
        if progress:
            click.echo(f"[{index}/{len(items)}] {item['action']} {_subject(item)} ...", nl=False)
        result = client.call("gc.run", {"keys": [item["key"]]})
        for d in result["done"]:
            done += 1
            freed += d["bytes"]
            tail = f"done ({human_bytes(d['bytes'])}): {d['detail']}"
            click.echo(f" {tail}" if progress else f"{d['action']} {_subject(d)}: {tail}")
        for s in result["skipped"]:
            skipped.append(s)
            tail = f"skipped: {s['reason']}"
            click.echo(f" {tail}" if progress else f"{s['action']} {_subject(s)}: {tail}")
    for s in plan["skipped"]:
        click.echo(f"left alone: {s['action']} {_subject(s)} ({s['reason']})")
    click.echo(f"{done} collected, {len(skipped)} skipped, {human_bytes(freed)} freed")
