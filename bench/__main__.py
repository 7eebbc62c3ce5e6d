"""`python -m bench [--quick] [--json [PATH]] [--only GROUPS] [--repeats N] [--large]`."""

from __future__ import annotations

import argparse
import compileall
import importlib
import json
import py_compile
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench import report
from bench.settings import Settings
from bench.stats import Figure

# Suite name -> module with `run(settings) -> list[Figure]`, in run order.
SUITES = {
    "rpc": "bench.rpc",
    "lifecycle": "bench.lifecycle",
    "bigrepo": "bench.bigrepo",
    "scale": "bench.scale",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer/shorter runs (for checks)")
    parser.add_argument("--repeats", type=int, default=None, help="repetitions per figure")
    parser.add_argument(
        "--large", action="store_true", help="also the large synthetic repository (slow)"
    )
    parser.add_argument(
        "--only", default="", help=f"comma-separated suites to run ({', '.join(SUITES)})"
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="write the figures as JSON to PATH ('-' or no PATH: stdout; the table then goes "
        "to stderr)",
    )
    return parser


def _write_bytecode() -> None:
    """Bytecode for every measured process, as an installed package has it: where
    PYTHONDONTWRITEBYTECODE is set (it is on the machines here) every xumd and xum started by
    the bench would otherwise compile its modules from source, and the start-up figures would
    measure the compiler. Checked-hash, as the test session writes it
    (tests/support/bytecode.py)."""
    here = Path(__file__).resolve().parent.parent
    # The three packages only: clients/ also holds node_modules, with Python files of its own.
    for part in ("daemon/xumd", "protocol/xum_protocol", "clients/xum_client"):
        compileall.compile_dir(
            here / part,
            quiet=1,
            invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
        )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _write_bytecode()
    settings = Settings.make(quick=args.quick, repeats=args.repeats, large=args.large)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()] or list(SUITES)
    unknown = [s for s in chosen if s not in SUITES]
    if unknown:
        sys.stderr.write(f"unknown suite(s): {', '.join(unknown)}; known: {', '.join(SUITES)}\n")
        return 2
    host = report.machine()
    figures: list[Figure] = []
    started = time.monotonic()
    for name in chosen:
        run: Callable[[Settings], list[Figure]] = importlib.import_module(SUITES[name]).run
        suite_started = time.monotonic()
        figures.extend(run(settings))
        sys.stderr.write(f"bench: suite {name} took {time.monotonic() - suite_started:.1f}s\n")
    sys.stderr.write(f"bench: total {time.monotonic() - started:.1f}s\n")
    table_out = sys.stderr if args.json == "-" else sys.stdout
    table_out.write(
        f"xum bench ({'quick' if settings.quick else 'full'}, {settings.repeats} repetitions; "
        f"{host['cpus']} CPUs, {host['cpu']}, Python {host['python']}, {host['git']})\n\n"
    )
    report.table(figures, table_out)
    table_out.flush()
    if args.json is not None:
        payload = json.dumps(report.as_json(figures, settings.as_dict(), host), indent=2)
        if args.json == "-":
            sys.stdout.write(payload + "\n")
        else:
            with open(args.json, "w", encoding="utf-8") as out:
                out.write(payload + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
