"""`xum`'s entry point: `xum status` without loading click.

Editor hooks and scripts run `xum status` on every prompt; loading click (with the uuid,
platform, gettext and regular expressions it brings) was about half of that command's cost
over a bare `python -c pass` (docs/PERFORMANCE.md, "Copies kept for speed"). So the exact forms
of that one command that a script uses, off a terminal, are answered here without click:

    xum [--root R] [--socket S] [--json] status [--json]

(`--root=R` and `--socket=S` too; each option at most once; not with `XUM_HOST` set). Their
output and exit codes are the command line's own: the lines come from the same module
(`commands/_status.py`) and a failure is reported by the command line's own `fail`. Anything
else, and any form on a terminal (a person reading a table), goes to the click command line
(`xum_client.cli`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

_VALUED = ("--root", "--socket")


def status_args(args: Sequence[str]) -> tuple[str | None, str | None, bool] | None:
    """(root, socket, as_json) when `args` is exactly a `status` the fast path answers the same
    way as the command line would, else None."""
    given: dict[str, str] = {}
    as_json = False
    seen_command = False
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--json":
            as_json = True
        elif arg == "status" and not seen_command:
            seen_command = True
        elif not seen_command and arg.split("=", 1)[0] in _VALUED:
            name, eq, value = arg.partition("=")
            if not eq:
                if not rest:
                    return None
                value = rest.pop(0)
            # Empty or option-like values, repeats: the command line's parser decides those.
            if name in given or not value or value.startswith("-"):
                return None
            given[name] = value
        else:
            return None
    if not seen_command:
        return None
    return given.get("--root"), given.get("--socket"), as_json


def main(argv: Sequence[str] | None = None) -> None:
    from xum_client.commands import _stdio

    args = list(argv) if argv is not None else sys.argv[1:]
    # A closed stream (`>&-`) becomes /dev/null, a reader that went away (`| head`) exit 141,
    # an output that cannot be written (a full disk) exit 1: both paths below alike there
    # (`commands/_stdio.py`).
    _stdio.prepare()
    _stdio.run_guarded(lambda: _main(args))


def _main(args: list[str]) -> None:
    parsed = status_args(args)
    # XUM_HOST: the daemon on another host, through ssh (docs/HOSTS.md), is the command line's.
    assert sys.stdout is not None  # `prepare` opened /dev/null for a closed one
    if parsed is None or sys.stdout.isatty() or os.environ.get("XUM_HOST"):
        from xum_client.cli import run

        run(args)
        return
    root, socket_path, as_json = parsed
    from xum_client.errors import XumClientError
    from xum_client.sync import Client

    try:
        with Client(root, client_name="xum-cli", socket_path=socket_path) as client:
            result = client.call("daemon.status")
    except XumClientError as exc:
        from xum_client.cli import fail

        fail(exc, args)
    except KeyboardInterrupt:
        import click

        sys.stderr.write("\n")  # as click does before its Abort
        from xum_client.cli import fail

        fail(click.exceptions.Abort(), args)
    if as_json:
        text = json.dumps(result, default=str) + "\n"
    else:
        from xum_client.commands._status import plain

        text = plain(result)
    sys.stdout.write(text)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
