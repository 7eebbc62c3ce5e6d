from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.support.daemon import DaemonProcess, short_tmpdir, write_config


@pytest.fixture(scope="module")
def fuzz_daemon() -> Iterator[DaemonProcess]:
    """One daemon for a whole module of fuzz cases, with a small frame cap (64 KiB) so the
    oversize path is cheap to reach. Info-level logs: fuzzing makes many thousands of requests."""
    tmp = short_tmpdir("xumf-")
    root = tmp / "root"
    write_config(root, "max_frame_bytes = 65536\n")
    proc = DaemonProcess(root, log_level="info").start()
    yield proc
    proc.close()
    if not os.environ.get("XUM_KEEP_TMP"):  # keep the daemon's log for a post-mortem
        shutil.rmtree(tmp, ignore_errors=True)
