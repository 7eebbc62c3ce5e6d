"""`--all-hosts` of `xum status`, `xum ws ls` and `xum events`: the local daemon and every host
of the hosts file in one view, each row qualified by its host (docs/HOSTS.md, "One view").

A target that cannot be asked (down, key refused, no xum, no daemon, too slow) is reported in
the output, never fatal: the exit status is 0 when at least one target answered, else 1.

`--json` shapes:

- `status`: `{"hosts": [{"host", "ok", "elapsed_s", "status" | "error"}]}`;
- `ws ls`: `{"workspaces": [{..., "host"}], "hosts": [{"host", "ok", "elapsed_s", "count" |
  "error"}]}`;
- `events`: one object per line, `{"host", "kind", "data"}` (`kind`: `subscribed`, `event`,
  `lost`, `error`; the last two's `data`: `allhosts.failure_data`).

`host` is null for the local daemon; `error` is `{code, kind, message, data}` as a failing
command prints it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from xum_client.allhosts import HostAnswer, HostEvents, gather, targets
from xum_client.commands._context import Ctx
from xum_client.commands._errors import error_object
from xum_client.commands._resolve import given, project_id, short
from xum_client.sync import Client

EXIT_NONE_ANSWERED = 1


def _check(obj: Ctx) -> None:
    if obj.host:
        raise click.UsageError("--all-hosts asks every host: it does not go with --host")


def _error(answer: HostAnswer[Any]) -> dict[str, Any]:
    assert answer.error is not None
    found = error_object(answer.error, 1)
    found.pop("exit", None)
    return found


def _entry(answer: HostAnswer[Any], **ok: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "host": answer.target.host,
        "ok": answer.ok,
        "elapsed_s": answer.elapsed_s,
    }
    if answer.ok:
        entry.update(ok)
    else:
        entry["error"] = _error(answer)
    return entry


def _finish(answers: list[HostAnswer[Any]]) -> None:
    if answers and not any(a.ok for a in answers):
        sys.exit(EXIT_NONE_ANSWERED)


def status_all(obj: Ctx, deadline_s: float) -> None:
    _check(obj)
    answers = gather(lambda c: c.call("daemon.status"), targets(obj.root, obj.socket), deadline_s)
    data = {"hosts": [_entry(a, status=a.result) for a in answers]}
    rows: list[list[Any]] = []
    for a in answers:
        if a.ok and a.result is not None:
            r = a.result
            state = "shutting down" if r.get("shutting_down") else "serving"
            rows.append(
                [
                    a.target.label,
                    f"xumd {r['version']}",
                    r["pid"],
                    r["root"],
                    f"{r['uptime_s']:.0f}s",
                    state,
                ]
            )
        else:
            err = _error(a)
            rows.append([a.target.label, "-", "-", "-", "-", f"{err['kind']}: {err['message']}"])
    obj.table(data, ["host", "daemon", "pid", "root", "uptime", "state"], rows)
    _finish(answers)


def ws_ls_all(obj: Ctx, project_ref: str | None, state: str | None, deadline_s: float) -> None:
    _check(obj)

    def listing(client: Client) -> dict[str, Any]:
        from xum_client.commands.listing import list_workspaces

        pid = project_id(client, project_ref) if project_ref else None
        # Every page (a daemon pages its answer; an older one answers all at once).
        return list_workspaces(client, given(project_id=pid, state=state), None, None)

    answers = gather(listing, targets(obj.root, obj.socket), deadline_s)
    workspaces: list[dict[str, Any]] = []
    lines: list[str] = []
    width = max((len(a.target.label) for a in answers), default=5)
    for a in answers:
        if a.ok and a.result is not None:
            for w in a.result.get("workspaces", []):
                workspaces.append({**w, "host": a.target.host})
                lines.append(f"{a.target.label:<{width}}  {short(w)}")
    problems = []
    for a in answers:
        if not a.ok:
            err = _error(a)
            problems.append(f"{a.target.label:<{width}}  {err['kind']}: {err['message']}")
    data = {
        "workspaces": workspaces,
        "hosts": [_entry(a, count=len((a.result or {}).get("workspaces", []))) for a in answers],
    }
    human = "\n".join(lines) if lines else "no workspaces"
    if problems:
        human += "\n" + "\n".join(problems)
    obj.emit(data, human)
    _finish(answers)


def events_all(obj: Ctx, types: tuple[str, ...], count: int | None, deadline_s: float) -> None:
    """Events of every target, one line each, tagged by host (until interrupted or --count)."""
    _check(obj)
    shown = 0
    with HostEvents(targets(obj.root, obj.socket), types, deadline_s=deadline_s) as stream:
        for item in stream:
            if obj.as_json:
                click.echo(json.dumps({"host": item.host, "kind": item.kind, "data": item.data}))
            elif item.kind == "event":
                e = item.data
                click.echo(f"{item.label}  {e.get('seq', ''):>6} {e.get('type', '')}".rstrip())
            elif item.kind == "subscribed":
                click.echo(
                    f"{item.label}  epoch {item.data.get('epoch')}, at seq {item.data.get('seq')}"
                )
            else:
                click.echo(f"{item.label}  {item.kind}: {item.data.get('error')} (retrying)")
            if item.kind == "event":
                shown += 1
                if count is not None and shown >= count:
                    return
