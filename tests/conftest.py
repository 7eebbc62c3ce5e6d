from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.crash.world import World
from tests.support.daemon import DaemonProcess, short_tmpdir


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
