from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.crash.world import World
from tests.support import bytecode
from tests.support.daemon import DaemonProcess, short_tmpdir
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project

REPO = Path(__file__).resolve().parent.parent


def pytest_sessionstart(session: pytest.Session) -> None:
    # Once per session, so that no test daemon or CLI process compiles the code from source
    # (tests/support/bytecode.py says why). Under pytest-xdist (`make test` runs `-n`) the
    # controller writes it before it starts the workers, which skip it: two workers writing the
    # same pycs would only race to the same content, but each would pay the hashing again.
    if hasattr(session.config, "workerinput"):
        return
    # The three packages only: clients/ also holds node_modules, with Python files of its own.
    bytecode.ensure(
        REPO / part for part in ("daemon/xumd", "protocol/xum_protocol", "clients/xum_client")
    )


# Files that take long for their few tests (a node suite, hypothesis budgets). xdist's own order
# (`--dist loadfile`: the files with the most tests first) would hand them out last, and the
# run would end with one worker on them while the other idles: they go first instead
# (`make test` passes --no-loadscope-reorder, so this order is the one the workers get).
_LONG_FIRST = ("test_ts_clients.py", "test_crash_stateful.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Only on xdist's workers: each collects the same items and sorts them the same way (the
    # controller checks that their collections agree). A plain run keeps pytest's file order.
    if not hasattr(config, "workerinput"):
        return
    count: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        count[path] = count.get(path, 0) + 1

    def key(item: pytest.Item) -> tuple[int, int]:
        path = item.nodeid.split("::")[0]
        name = path.rsplit("/", 1)[-1]
        first = _LONG_FIRST.index(name) if name in _LONG_FIRST else len(_LONG_FIRST)
        return (first, -count[path])

    items.sort(key=key)  # stable: each file's tests keep their order


@pytest.fixture
def started_procs() -> Iterator[list[subprocess.Popen[Any]]]:
    """Processes a test starts (holders of a checkout, stand-in editors): killed and reaped at
    its end, whatever happened."""
    procs: list[subprocess.Popen[Any]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def tmp_short() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def root(tmp_short: Path) -> Path:
    return tmp_short / "root"


@pytest.fixture
def daemon(root: Path) -> Iterator[DaemonProcess]:
    proc = DaemonProcess(root).start()
    yield proc
    proc.close()


@pytest.fixture
def world() -> Iterator[World]:
    """A crash-test world: a template repository, a root, a daemon launcher (tests/crash)."""
    base = short_tmpdir("xumw-")
    w = World(base)
    try:
        yield w
    finally:
        w.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def repo(tmp_short: Path) -> Path:
    """A small git repository made by the test (override in a module for other content)."""
    return make_repo(tmp_short / "repo")


@pytest.fixture
def project(daemon: DaemonProcess, repo: Path) -> dict[str, Any]:
    """`repo` registered with the `daemon` as a project."""
    return add_project(daemon, repo)


@pytest.fixture
def ctl(tmp_short: Path) -> Path:
    """A directory of control files a test flips to steer scripts it runs (e.g. `ctl/ok`)."""
    path = tmp_short / "ctl"
    path.mkdir()
    return path
