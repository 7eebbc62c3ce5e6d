"""The root is made owner-only at start (it holds the socket and every checkout's state), but
only when it is xum's own: a new or empty directory, or one a previous start or a client
prepared. A directory that others may enter and that holds other things (`--root /tmp`,
`--root ~`, a project's directory) is refused with a clear error and left as it was."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import DaemonProcess


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_shared_directory_of_other_things_is_refused_untouched(tmp_short: Path) -> None:
    shared = tmp_short / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    (shared / "notes.txt").write_text("someone's\n")
    done = subprocess.run(
        [sys.executable, "-m", "xumd", "--root", str(shared)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 4, done.stderr
    assert "holds other things and others may enter it" in done.stderr
    assert _mode(shared) == 0o755  # not locked down behind its users' backs
    assert sorted(p.name for p in shared.iterdir()) == ["notes.txt"]  # no lock, no database


def test_a_root_a_client_prepared_is_made_owner_only(tmp_short: Path) -> None:
    # The bridge creates ROOT/xumd.log before it starts the daemon; a user's `mkdir` gave 0755.
    root = tmp_short / "root"
    root.mkdir()
    os.chmod(root, 0o755)
    (root / "xumd.log").write_bytes(b"")
    daemon = DaemonProcess(root).start()
    try:
        assert _mode(root) == 0o700
    finally:
        daemon.close()


def test_an_empty_directory_is_made_owner_only(tmp_short: Path) -> None:
    root = tmp_short / "empty"
    root.mkdir()
    os.chmod(root, 0o755)
    daemon = DaemonProcess(root).start()
    try:
        assert _mode(root) == 0o700
    finally:
        daemon.close()
