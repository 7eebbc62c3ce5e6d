"""`xumd`: the daemon's command line.

Start-up cost (docs/PERFORMANCE.md, "Start-up"): the daemon's time to ready is almost
all imports, so this module imports nothing heavy at its top, runs the imports with the cyclic
garbage collector paused, and, after a clean stop, leaves without the interpreter's teardown.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import sys
import threading
import time
import types
from pathlib import Path

from xumd import __version__

EXIT_THREADS_WAIT_S = 2.0
"""At exit: how long the fast exit waits for worker threads that are finishing (anyio's idle
workers stop when the event loop ends); past it, the ordinary exit joins them as before."""


EXIT_FLUSH_FAILED = 120
"""The interpreter's own status when flushing stdio at exit fails (Py_FinalizeEx)."""


def _parser() -> argparse.ArgumentParser:
    from xumd.base import logs

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
    # Start-up builds some 50,000 long-lived objects (modules, classes, functions) and no
    # garbage worth collecting: every cycle collection during the imports walks them all again
    # for nothing (about a tenth of their CPU). Collect nothing while the daemon's code loads,
    # then move what it built to the permanent generation (gc.freeze), so that the collections
    # of the serving daemon never walk it either.
    gc.disable()
    try:
        from xumd.base import faults, logs

        args = _parser().parse_args(argv)
        level = args.log_level or os.environ.get("XUM_LOG_LEVEL", "info").strip().lower()
        unknown = level not in logs.LEVELS
        logs.configure(
            "info" if unknown else level,
            json={"auto": None, "json": True, "console": False}[args.log_format],
        )
        if unknown:
            # Said, not swallowed: a user who asked for debug lines learns why there are none.
            logs.get("xumd.startup.main").warning(
                "daemon.log_level_unknown", value=level, known=list(logs.LEVELS), using="info"
            )
        _without_pydantic_plugins()
        from xumd.startup import composition
        from xumd.startup.runner import run_daemon

        if args.list_fault_points or os.environ.get(faults.ENV_VAR):
            # Every fault point is declared at import: those of the features built at their
            # first request too.
            composition.import_deferred()
    finally:
        gc.freeze()
        gc.enable()

    if args.list_fault_points:
        for name in faults.all_points():
            print(name)
        return 0

    code = run_daemon(args.root, args.socket, keep_processes=args.keep_processes)
    _leave(code)
    return code


def _without_pydantic_plugins() -> None:
    """Pydantic looks for plugins at its first model build: it imports `importlib.metadata`
    (with email, zipfile, csv...) and reads the entry points of every installed distribution,
    some 26 modules and a scan of site-packages before readiness. The daemon's own models use no
    plugin (a plugin instruments validation for its user's app; the daemon is not one), so its
    process gets a loader that finds none. Only this process: nothing is put in the environment
    that its children (agents, scripts) inherit."""
    if "pydantic.plugin._loader" in sys.modules:
        return  # already looked (an embedding process): its answer stands
    loader = types.ModuleType("pydantic.plugin._loader", "xumd: no pydantic plugins")
    loader.get_plugins = tuple  # type: ignore[attr-defined]  # () : no plugin
    sys.modules["pydantic.plugin._loader"] = loader


def _leave(code: int) -> None:
    """Exit now, skipping the interpreter's teardown (freeing every module and object: tens of
    milliseconds of CPU per stop, paid by every restart and every test daemon).

    Only after a run that returned: the store is closed (checkpointed), the root lock released
    and the socket removed by then, so the teardown has nothing durable left to do. atexit
    handlers still run and stdio is flushed. If a non-daemon thread is still busy after
    EXIT_THREADS_WAIT_S, return instead: the ordinary exit joins it, as it always did; so does a
    process under a profiler or a tracer (cProfile, a debugger), which writes its report last."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return
    deadline = time.monotonic() + EXIT_THREADS_WAIT_S
    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is None or stream.closed:  # None: started with that descriptor closed
            continue
        try:
            stream.flush()
        except OSError:
            # What the ordinary exit does when its last flush fails (a full disk under the
            # log, a closed pipe): the status says so, never a clean 0 with lines lost.
            code = EXIT_FLUSH_FAILED
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
