"""Start-up cost, guarded by what a process loads, never by a clock.

- `xum status` (the command editor hooks run on every prompt) loads neither click nor anything
  heavy, and says exactly what the click command line says;
- the daemon reaches readiness without rich (structlog's console extras) or the test-only
  methods' models;
- the daemon's start-up pauses the cyclic GC only while its code loads;
- right after READY=1 the daemon gives back what its start-up passes held (the C heap's free
  pages where the libc can: glibc's malloc_trim);
- after a clean stop the daemon leaves without the interpreter's teardown, but never while a
  worker thread is still busy, and never without running atexit handlers and flushing stdio;
- the test session writes checked-hash bytecode, so no stale bytecode ever runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from xum_client.entry import status_args
from xumd.system import platform
from xumd.system.platform import linux, portable

from tests.support import bytecode
from tests.support.daemon import DaemonProcess

REPO = Path(__file__).resolve().parents[2]

XUM = str(Path(sys.executable).parent / "xum")
CLICK_CLI = [sys.executable, "-c", "from xum_client.cli import main; main()"]

HEAVY_FOR_THE_CLI = (
    "click",
    "rich",
    "pydantic",
    "anyio",
    "asyncio",
    "psutil",
    "structlog",
    "orjson",
    "dataclasses",
    "xumd",
    "xum_protocol.models",
    "xum_protocol.methods",
)


def imported(stderr: str) -> set[str]:
    """The modules a process imported, from its `-X importtime` lines on stderr."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def heavy(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )


# -- xum status ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["status"], ["--json", "status"], ["status", "--json"]])
def test_xum_status_loads_nothing_heavy(daemon: DaemonProcess, args: list[str]) -> None:
    done = run([XUM, "--root", str(daemon.root), *args], PYTHONPROFILEIMPORTTIME="1")
    assert done.returncode == 0, done.stderr
    modules = imported(done.stderr)
    assert "xum_client.entry" in modules  # the measurement saw the run
    assert heavy(modules, HEAVY_FOR_THE_CLI) == []
    if "--json" in args:
        assert json.loads(done.stdout)["pid"] == daemon.pid
    else:
        assert f"pid:         {daemon.pid}\n" in done.stdout


def test_xum_status_on_a_terminal_is_the_click_command_line(daemon: DaemonProcess) -> None:
    # A person at a terminal gets the table: that is the click command line's (with rich).
    import pty

    primary, secondary = pty.openpty()
    try:
        done = subprocess.run(
            [XUM, "--root", str(daemon.root), "status"],
            stdout=secondary,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
        )
    finally:
        os.close(secondary)
        os.close(primary)
    assert done.returncode == 0
    assert "click" in imported(done.stderr)


def _masked(text: str) -> str:
    # The only lines that change between two calls: the uptime.
    return "\n".join(line for line in text.splitlines() if not line.startswith("uptime:"))


def test_xum_status_says_what_the_click_command_line_says(daemon: DaemonProcess) -> None:
    root = str(daemon.root)
    fast = run([XUM, "--root", root, "status"])
    slow = run([*CLICK_CLI, "--root", root, "status"])
    assert (fast.returncode, _masked(fast.stdout), fast.stderr) == (
        slow.returncode,
        _masked(slow.stdout),
        slow.stderr,
    )
    fast_json = json.loads(run([XUM, f"--root={root}", "status", "--json"]).stdout)
    slow_json = json.loads(run([*CLICK_CLI, f"--root={root}", "status", "--json"]).stdout)
    assert fast_json.keys() == slow_json.keys()
    assert fast_json["pid"] == slow_json["pid"] == daemon.pid


@pytest.mark.parametrize("as_json", [False, True])
def test_xum_status_fails_as_the_click_command_line_does(tmp_short: Path, as_json: bool) -> None:
    # No daemon: exit 4, the same message (stderr, or one JSON object on stdout with --json).
    args = ["--root", str(tmp_short / "none"), "status", *(["--json"] if as_json else [])]
    fast = run([XUM, *args])
    slow = run([*CLICK_CLI, *args])
    assert fast.returncode == slow.returncode == 4
    assert (fast.stdout, fast.stderr) == (slow.stdout, slow.stderr)
    if as_json:
        assert json.loads(fast.stdout)["error"]["kind"] == "no_daemon"
    else:
        assert "no daemon on" in fast.stderr


def test_xum_status_by_socket_and_environment(daemon: DaemonProcess) -> None:
    by_socket = run([XUM, "--socket", str(daemon.socket_path), "status", "--json"])
    by_env = run([XUM, "status", "--json"], XUM_ROOT=str(daemon.root))
    assert json.loads(by_socket.stdout)["pid"] == daemon.pid
    assert json.loads(by_env.stdout)["pid"] == daemon.pid


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["status"], (None, None, False)),
        (["--json", "status"], (None, None, True)),
        (["status", "--json"], (None, None, True)),
        (["--root", "/r", "status"], ("/r", None, False)),
        (["--root=/r", "--socket=/s", "status", "--json"], ("/r", "/s", True)),
    ],
)
def test_the_forms_the_fast_entry_answers(
    args: list[str], expected: tuple[str | None, str | None, bool]
) -> None:
    assert status_args(args) == expected


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--help"],
        ["status", "--help"],
        ["--version"],
        ["status", "status"],
        ["status", "--root", "/r"],  # not an option of `status`: click's usage error
        ["--root"],
        ["--root", "status"],  # `status` is the root here, for click: no command
        ["--root", "", "status"],
        ["--root", "/a", "--root", "/b", "status"],
        ["--socket", "--json", "status"],
        ["-h", "status"],
        ["--", "status"],
        ["daemon", "status"],
        ["ws", "ls"],
    ],
)
def test_every_other_form_goes_to_the_click_command_line(args: list[str]) -> None:
    assert status_args(args) is None


def test_a_form_the_fast_entry_refuses_gets_clicks_answer(daemon: DaemonProcess) -> None:
    done = run([XUM, "--root", str(daemon.root), "status", "--bogus"])
    assert done.returncode == 2
    assert "No such option" in done.stderr


# -- the daemon --------------------------------------------------------------------------------


def test_the_daemon_reaches_readiness_without_rich_or_test_methods(root: Path) -> None:
    daemon = DaemonProcess(root, log_level="info", env={"PYTHONPROFILEIMPORTTIME": "1"}).start()
    try:
        daemon.call("daemon.status")
    finally:
        daemon.close()
    log = daemon.log_text()
    before_ready = log[: log.index('"daemon.ready"')]
    modules = imported(before_ready)
    assert "xumd.startup.composition" in modules  # the measurement saw the start-up
    # structlog still asks for rich (a None in sys.modules answers: listed, 0 ms, not loaded);
    # a loaded rich shows its submodules (structlog.dev takes rich.console and rich.traceback).
    assert (
        heavy(modules, ("rich.console", "rich.traceback", "pygments", "click", "xum_client")) == []
    )
    assert "xumd.rpc.spec_examples" not in modules  # enable_test_methods is off


def test_rich_is_hidden_from_structlog_only() -> None:
    # structlog loads without rich (its console extras), yet a later `import rich` in the same
    # process (the CLI's tables beside a daemon's logger, as in-process tests have) gets it.
    code = "import xumd.base.logs, structlog.dev, rich.console; print(structlog.dev.rich is None)"
    done = run([sys.executable, "-c", code])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]


READY_MODULES_AT_MOST = 288
"""What the daemon imports before READY=1 on an empty root, as `-X importtime` lists it (about
285 on Python 3.11; three of them small and needed to serve: the dispatcher's request keys,
`rpc/requestkeys.py` and `base/requestkey.py`, and the walker under the trash's delete,
`system/walk.py`). What must stay out is `HEAVY_BEFORE_READY`: the lean start builds the feature
graph at its first request and keeps pydantic, the protocol's models and psutil out of the way
to readiness. A new import on the readiness path shows
here: raise the bound only for what READY=1 truly needs. The daemon's layer folders' packages
(`FOLDER_PACKAGES`, empty `__init__.py` files: what `ls daemon/xumd` shows) are not counted."""

FOLDER_PACKAGES = frozenset({"xumd.base", "xumd.system", "xumd.startup", "xumd.daemon"})

HEAVY_BEFORE_READY = (
    "pydantic",
    "psutil",
    "xum_protocol.models",
    "xum_protocol.methods",
    "xumd.startup.feature_graph",
    "xumd.lifecycle",
    "xumd.cleanup",
    "xumd.processes",
    "xumd.turns",
    "xumd.recovery",
    "xumd.usage",
    "xumd.gc",
    "xumd.system.git",
)
"""What an empty root's daemon does not import before READY=1 (the lean start: tests/
test_lean_start.py): pydantic, psutil, the protocol's models and method table, and the feature
graph, loaded at the first request that needs them."""

DEFERRED = ("xumd.gc.service", "xumd.gc.plan", "xumd.usage.service", "xumd.usage.walk")


def test_the_daemon_imports_only_what_readiness_needs(root: Path) -> None:
    daemon = DaemonProcess(root, log_level="info", env={"PYTHONPROFILEIMPORTTIME": "1"}).start()
    try:
        assert "items" in daemon.call("gc.plan")
    finally:
        daemon.close()
    log = daemon.log_text()
    before_ready = imported(log[: log.index('"daemon.ready"')])
    assert "xumd.startup.composition" in before_ready  # the measurement saw the start-up
    for package in FOLDER_PACKAGES:  # empty: they cost a stat and an empty module each
        assert (REPO / "daemon" / package.replace(".", "/") / "__init__.py").read_bytes() == b""
    counted = before_ready - FOLDER_PACKAGES
    assert len(counted) <= READY_MODULES_AT_MOST, len(counted)
    assert heavy(before_ready, HEAVY_BEFORE_READY) == []
    # Built at their first request (xumd.rpc.deferred), and no plugin lookup by pydantic
    # (importlib.metadata and the scan of every installed distribution).
    assert heavy(before_ready, (*DEFERRED, "importlib.metadata")) == []
    assert set(DEFERRED) <= imported(log)  # loaded by the first gc call


def test_fault_points_of_deferred_modules_are_declared_for_the_harness() -> None:
    # `--list-fault-points` and XUM_FAULT see every point, those of the modules a deferred
    # feature imports at its first request too (main imports them when either is used).
    code = textwrap.dedent(
        """
        import contextlib, io, sys
        from xumd.startup.main import main
        with contextlib.redirect_stdout(io.StringIO()):
            main(["--list-fault-points"])
        print(all(m in sys.modules for m in sys.argv[1:]))
        """
    )
    done = run([sys.executable, "-c", code, *DEFERRED])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]


def test_the_gc_runs_again_once_the_code_is_loaded() -> None:
    code = textwrap.dedent(
        """
        import contextlib, gc, io
        from xumd.startup.main import main
        with contextlib.redirect_stdout(io.StringIO()):
            main(["--list-fault-points"])
        print(gc.isenabled(), gc.get_freeze_count() > 10000)
        """
    )
    done = run([sys.executable, "-c", code])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


_LEAVE = """
import atexit, sys, threading
from xumd.startup import main
atexit.register(lambda: print("atexit ran"))
sys.stdout.write("buffered ")  # no newline: only a flush writes it
busy = threading.Event()
if "busy" in sys.argv:
    main.EXIT_THREADS_WAIT_S = 0.05
    threading.Thread(target=busy.wait).start()  # a non-daemon thread that has not finished
main._leave(7)
print("returned")
busy.set()
"""


def _buffered_env() -> dict[str, str]:
    # Without PYTHONUNBUFFERED (set on these machines): only a flush writes what _LEAVE wrote.
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def test_what_the_start_up_passes_held_is_released_after_readiness(root: Path) -> None:
    daemon = DaemonProcess(root, log_level="info").start()
    try:
        daemon.call("daemon.status")
    finally:
        daemon.close()
    events = [json.loads(line) for line in daemon.log_text().splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    assert names.index("daemon.ready") < names.index("daemon.startup_memory_released")
    released = events[names.index("daemon.startup_memory_released")]
    assert released["heap_trimmed"] is (platform.current().NAME == "linux")


def test_the_heap_release_is_a_no_op_where_the_libc_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    glibc = "CS_GNU_LIBC_VERSION" in os.confstr_names and os.confstr("CS_GNU_LIBC_VERSION")
    assert linux.release_free_heap() is bool(glibc)
    monkeypatch.setattr(linux, "_libc", SimpleNamespace)  # a libc without malloc_trim (musl)
    assert linux.release_free_heap() is False
    assert portable.release_free_heap() is False


def test_a_clean_stop_leaves_at_once_flushing_stdio_and_running_atexit() -> None:
    env = _buffered_env()
    done = subprocess.run(
        [sys.executable, "-c", _LEAVE], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 7
    assert done.stdout == "buffered atexit ran\n"


def test_a_failed_last_flush_is_not_a_clean_exit() -> None:
    # stdout on a full disk: its last flush fails. The ordinary exit says so with status 120;
    # so must the fast one (it used to swallow the error and report the run's own status).
    env = _buffered_env()
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-c", _LEAVE], stdout=full, stderr=subprocess.PIPE, timeout=60, env=env
        )
        ordinary = subprocess.run(
            [sys.executable, "-c", "import sys; sys.stdout.write('x'); sys.exit(7)"],
            stdout=full,
            stderr=subprocess.PIPE,
            timeout=60,
            env=env,
        )
    assert ordinary.returncode == 120  # the interpreter's own rule, for reference
    assert done.returncode == 120


def test_a_busy_worker_thread_gets_the_ordinary_exit() -> None:
    env = _buffered_env()
    done = subprocess.run(
        [sys.executable, "-c", _LEAVE, "busy"], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0
    assert done.stdout == "buffered returned\natexit ran\n"


def test_a_stopped_daemon_has_logged_closed_and_freed_its_root(root: Path) -> None:
    daemon = DaemonProcess(root, log_level="info").start()
    try:
        assert daemon.terminate() == 0
        last = json.loads(daemon.log_text().splitlines()[-1])
        assert last["event"] == "daemon.stopped"
        assert not daemon.socket_path.exists()
        again = DaemonProcess(root, log_level="info").start()  # the root lock is free
        again.close()
    finally:
        daemon.close()


# -- bytecode for the test processes -----------------------------------------------------------


def test_session_bytecode_is_never_stale(tmp_short: Path) -> None:
    package = tmp_short / "pkg"
    package.mkdir()
    module = package / "stale_probe.py"
    module.write_text("VALUE = 1\n")
    stamp = module.stat().st_mtime_ns
    assert bytecode.ensure([package]) == [module]
    assert bytecode.ensure([package]) == []  # fresh: nothing to do
    # Same size, same timestamp, other content: a timestamp pyc would run the old code.
    module.write_text("VALUE = 2\n")
    os.utime(module, ns=(stamp, stamp))
    probe = "import stale_probe; print(stale_probe.VALUE)"
    done = run([sys.executable, "-c", probe], PYTHONPATH=str(package), PYTHONDONTWRITEBYTECODE="1")
    assert done.stdout.strip() == "2"
    assert bytecode.ensure([package]) == [module]


def test_the_session_wrote_bytecode_for_the_code_under_test() -> None:
    # What every test daemon and `xum` starts from (conftest.pytest_sessionstart).
    import importlib.util

    import xum_client.entry
    import xum_protocol.methods
    import xumd.app

    for module in (xumd.app, xum_protocol.methods, xum_client.entry):
        source = Path(str(module.__file__))
        cached = Path(importlib.util.cache_from_source(str(source)))
        assert bytecode._fresh(source.read_bytes(), cached), cached
