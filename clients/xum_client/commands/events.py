"""`xum events`: watch the daemon's events, and resume after a reconnect (`--after-seq`/`--epoch`).

With `--json` it prints one JSON object per line: the subscribe answer first (its `snapshot`, or
on a resume the replayed `events`, and `resync_required`), then each event as the daemon sends it.
A script resumes with the `epoch` and the last `seq` it printed.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import click

from xum_client.commands._context import Ctx, host_timeout_option
from xum_client.errors import ConnectionLost


def _subject(data: dict[str, Any]) -> str:
    for key in ("workspace", "project", "process", "obligation", "lease", "turn"):
        value = data.get(key)
        if isinstance(value, dict):
            name = value.get("name")
            ident = value.get("id", "")
            state = value.get("state") or value.get("status") or ""
            return " ".join(str(part) for part in (ident, name or "", state) if part)
    for key in ("workspace_id", "project_id"):
        if data.get(key):
            return str(data[key])
    return ""


def _line(event: dict[str, Any]) -> str:
    return f"{event['seq']:>6} {event['type']:<28} {_subject(event.get('data') or {})}".rstrip()


def register(cli: click.Group) -> None:
    @cli.command("events")
    @click.option(
        "--type", "types", multiple=True, help="Only types starting with this (repeatable)."
    )
    @click.option("--after-seq", type=click.IntRange(min=0), help="Resume after this seq...")
    @click.option("--epoch", help="...of this epoch (both, or neither).")
    @click.option(
        "--count",
        type=click.IntRange(min=1),
        help="Stop after this many events (replayed ones count).",
    )
    @click.option(
        "--all-hosts",
        is_flag=True,
        help="The local daemon's and every host's events, each line tagged by host.",
    )
    @host_timeout_option("connection")
    @click.pass_obj
    def events(  # noqa: PLR0917 - one parameter per click option
        obj: Ctx,
        types: tuple[str, ...],
        after_seq: int | None,
        epoch: str | None,
        count: int | None,
        all_hosts: bool,
        host_timeout: float,
    ) -> None:
        """Print the daemon's events as they happen (until interrupted, or --count)."""
        if all_hosts:
            if after_seq is not None or epoch is not None:
                raise click.UsageError("--after-seq/--epoch are per daemon: not with --all-hosts")
            from xum_client.commands.allhosts_view import events_all

            events_all(obj, types, count, host_timeout)
            return
        if (after_seq is None) != (epoch is None):
            raise click.UsageError("--after-seq and --epoch go together")
        params: dict[str, Any] = {"types": list(types)} if types else {}
        if after_seq is not None:
            params.update(after_seq=after_seq, epoch=epoch)
        shown = 0
        with obj.client(timeout=None) as client:
            answer = client.call("events.subscribe", params)
            if obj.as_json:
                click.echo(json.dumps(answer), nl=True)
            elif answer.get("resync_required"):
                click.echo(
                    f"resync required (epoch {answer['epoch']}): events after {after_seq} are "
                    f"no longer held or the daemon restarted; state at seq {answer['seq']} "
                    "follows from a snapshot"
                )
            else:
                click.echo(f"epoch {answer['epoch']}, at seq {answer['seq']}")
            # The replay counts towards --count (with --json it is in the answer line, whole).
            replayed = (answer.get("events") or [])[:count]
            if not obj.as_json:
                for event in replayed:
                    click.echo(_line(event))
            shown += len(replayed)
            last = int(replayed[-1]["seq"]) if replayed else int(answer["seq"])
            while count is None or shown < count:
                try:
                    message = client.next_notification()
                except ConnectionLost as exc:
                    raise _resumable(exc, obj, str(answer["epoch"]), last, types) from None
                if message.get("method") != "event":
                    continue
                event = message.get("params") or {}
                click.echo(json.dumps(event) if obj.as_json else _line(event))
                last = int(event.get("seq", last))
                shown += 1


def _resumable(
    exc: ConnectionLost, obj: Ctx, epoch: str, last: int, types: tuple[str, ...]
) -> ConnectionLost:
    """`exc` (where the stream ended, and why: ssh's status through a host), and the command
    that picks the stream up after the last event printed."""
    words = ["xum"]
    for option, value in (("--host", obj.host), ("--root", obj.root), ("--socket", obj.socket)):
        words += [option, value] if value else []
    words.append("events")
    words += [f"--type={t}" for t in types] + [f"--epoch={epoch}", f"--after-seq={last}"]
    return ConnectionLost(
        f"{exc}; resume after the last event shown with `{shlex.join(words)}`",
        host=exc.host,
        method=exc.method,
        sent=exc.sent,
        status=exc.status,
        detail=exc.detail,
    )
