"""The test daemon helper itself (tests/support/daemon.py): closing a daemon started through a
launcher that forks stops the daemon by SIGTERM at once, not the launcher by SIGKILL after a
15 s grace (what every such test paid before)."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess

UNSHARE = shutil.which("unshare")


@pytest.mark.skipif(UNSHARE is None, reason="unshare not found (util-linux)")
def test_close_through_a_forking_launcher_terminates_the_daemon_itself(root: Path) -> None:
    # `unshare --fork` ignores SIGTERM while it waits for its child; `--kill-child` only acts
    # once unshare itself dies. No namespace is asked for, so this runs anywhere.
    assert UNSHARE is not None
    daemon = DaemonProcess(root, launcher=[UNSHARE, "--fork", "--kill-child=KILL", "--"])
    daemon.start()
    assert daemon.call("daemon.status")["pid"] != daemon.pid  # the launcher forked
    daemon.close()
    assert daemon.proc is not None
    # The launcher ended on its own, passing on its child's end: nobody SIGKILLed it (before,
    # close waited out 15 s, then did). With --kill-child=KILL, a daemon that was still there
    # when its launcher died would have been SIGKILLed, and said nothing in its log.
    assert daemon.proc.returncode != -signal.SIGKILL, daemon.log_text()[-2000:]
    assert "daemon.stopped" in daemon.log_text()  # a graceful stop, to its last line
