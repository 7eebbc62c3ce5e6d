"""`xum du`: disk usage of the workspaces and of the root (trash, archive store, reclaims), and
the disk budget (`[gc]`): how far from it each filesystem is."""

from __future__ import annotations

from typing import Any

import click

from xum_client.commands._context import Ctx
from xum_client.commands._resolve import workspace_id
from xum_client.sync import Client

USAGE_TIMEOUT_S = 600.0
"""A walk of every checkout runs under the daemon's own deadline (`usage.deadline_s`)."""


def human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} B"  # pragma: no cover - the loop always returns


def usage_cell(entry: dict[str, Any]) -> str:
    figures = entry.get("usage")
    if not figures:
        return "-"
    cell = human_bytes(figures["bytes"])
    if not figures.get("complete", True):
        cell = ">= " + cell
    return cell


def budget_lines(parts: list[dict[str, Any]]) -> list[str]:
    """The disk budget ([gc] min_free_*, max_bytes), one line per part: how far from it."""
    lines: list[str] = []
    for part in parts:
        lack = part["deficit_bytes"]
        if part["what"] == "workspaces":
            excess = part.get("excess_workspaces") or 0
            state = f"{excess} too many" if excess else "holds"
            lines.append(
                f"budget {part['filesystem']}: {part.get('workspaces', 0)} workspace(s) with a "
                f"checkout ([gc] max_workspaces): {state}"
            )
            continue
        if part["what"] == "free":
            head = (
                f"budget {part['filesystem']}: {human_bytes(part['free_bytes'])} free of "
                f"{human_bytes(part['size_bytes'])}, keeps {human_bytes(part['limit_bytes'])}"
            )
            margin = part["free_bytes"] - part["limit_bytes"]
        else:
            head = (
                f"budget root: {human_bytes(part['used_bytes'])} of at most "
                f"{human_bytes(part['limit_bytes'])}"
            )
            margin = part["limit_bytes"] - part["used_bytes"]
        if lack:
            owed = part.get("pending_bytes") or 0
            tail = f"exceeded: lacks {human_bytes(lack)}"
            tail += f" ({human_bytes(owed)} already being reclaimed)" if owed else ""
        else:
            tail = f"holds, {human_bytes(margin)} to spare"
        lines.append(f"{head}: {tail}")
    return lines


def fetch_usage(obj: Ctx, ref: str | None = None, refresh: bool = False) -> dict[str, Any]:
    with obj.client(timeout=USAGE_TIMEOUT_S) as client:
        return _usage(client, ref, refresh)


def _usage(client: Client, ref: str | None, refresh: bool) -> dict[str, Any]:
    params: dict[str, Any] = {"refresh": refresh} if refresh else {}
    if ref is not None:
        params["workspace_id"] = workspace_id(client, ref)
    return client.call("workspace.usage", params)


def _budget(client: Client) -> list[dict[str, Any]]:
    """The disk budget's parts, measured now (empty: no budget set)."""
    parts: list[dict[str, Any]] = client.call("gc.plan", {"budget_only": True})["budget"]
    return parts


def _figures_line(label: str, figures: dict[str, Any]) -> str:
    line = f"{label}: {human_bytes(figures['bytes'])} in {figures['files']} file(s)"
    if figures.get("ignored_bytes"):
        line += f", {human_bytes(figures['ignored_bytes'])} ignored"
    if not figures.get("complete", True):
        line += f" (at least: {figures.get('error')})"
    return line


def register(cli: click.Group) -> None:
    @cli.command("du")
    @click.argument("ref", required=False)
    @click.option("--refresh", is_flag=True, help="walk again instead of a cached answer")
    @click.pass_obj
    def du(obj: Ctx, ref: str | None, refresh: bool) -> None:
        """Disk usage: allocated bytes of each checkout (or of REF), its ignored share and
        largest top-level entries, and the root's trash, archive store and pending reclaims."""
        with obj.client(timeout=USAGE_TIMEOUT_S) as client:  # one connection for both
            result = _usage(client, ref, refresh)
            if ref is None:
                result = {**result, "budget": _budget(client)}
        lines: list[str] = []
        for entry in result["workspaces"]:
            figures = entry.get("usage")
            head = f"{entry['name']} ({entry['workspace_id']}, {entry['state']})"
            if not figures:
                lines.append(f"{head}: no checkout on disk")
                continue
            lines.append(_figures_line(head, figures) + f" [{entry['age_s']:.0f}s old]")
            largest = ", ".join(
                f"{d['path']} {human_bytes(d['bytes'])}" for d in figures["largest"][:5]
            )
            if largest:
                lines.append(f"  largest: {largest}")
        root = result.get("root")
        if root:
            lines.append(f"workspaces: {human_bytes(root['workspaces_bytes'])}")
            lines.append(_figures_line("trash", root["trash"]))
            lines.append(_figures_line("archive store", root["archive_store"]))
            lines.append(
                f"pending reclaims: {root['pending_reclaims']} "
                f"({human_bytes(root['pending_reclaim_bytes'])})"
            )
            lines.append(f"total: {human_bytes(root['total_bytes'])}")
        lines += budget_lines(result.get("budget") or [])
        obj.emit(result, "\n".join(lines) if lines else "no workspaces")
