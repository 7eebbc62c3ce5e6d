"""`xumd`: the daemon's command line."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from xumd import __version__, faults, logs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xumd",
        description="xum's workspace lifecycle daemon: one per root, serving JSON-RPC 2.0 on "
        "ROOT/xumd.sock.",
    )
    parser.add_argument(
        "--root",
        type=Path,
        help="state root (env XUM_ROOT; default $XDG_STATE_HOME/xum, i.e. ~/.local/state/xum)",
    )
    parser.add_argument(
        "--socket",
        type=Path,
        help="socket path (env XUM_SOCKET; default ROOT/xumd.sock); for roots too deep for a "
        "Unix socket path",
    )
    parser.add_argument("--log-level", choices=logs.LEVELS, default=None, help="default: info")
    parser.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        default="auto",
        help="auto: console on a TTY, JSON lines otherwise",
    )
    parser.add_argument(
        "--keep-processes",
        action="store_true",
        help="leave agents running at shutdown; the next start adopts them through their leases",
    )
    parser.add_argument("--version", action="version", version=f"xumd {__version__}")
    parser.add_argument(
        "--list-fault-points", action="store_true", help="print every fault point name and exit"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    level = args.log_level or os.environ.get("XUM_LOG_LEVEL", "info")
    if level not in logs.LEVELS:
        level = "info"
    logs.configure(level, json={"auto": None, "json": True, "console": False}[args.log_format])

    # Importing the composition root declares every fault point.
    from xumd import bootstrap  # noqa: F401

    if args.list_fault_points:
        for name in faults.all_points():
            print(name)
        return 0

    from xumd.daemon_runner import run_daemon

    return run_daemon(args.root, args.socket, keep_processes=args.keep_processes)


if __name__ == "__main__":
    sys.exit(main())
