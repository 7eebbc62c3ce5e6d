"""A daemon whose mount table cannot be read (a fail-closed path): it
cannot prove that no mount lies inside a directory, so it deletes nothing there.

The daemon runs in its own mount namespace (`unshare -m`), where a write-only kernel file is
bound over its /proc/PID/mountinfo and /proc/PID/mounts: reading them fails with a real EACCES,
for that daemon only, and the binding goes with the namespace."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from xum_protocol.errors import ErrorKind

from tests.support.daemon import DaemonProcess
from tests.support.lifecycle_helpers import kept_env_copy, rpc_error

# Write-only kernel attributes: opening one for reading fails even for root.
UNREADABLE = [Path("/sys/bus/platform/uevent"), Path("/sys/bus/pci/rescan")]


def _unreadable_file() -> Path:
    for candidate in UNREADABLE:
        try:
            candidate.open("rb").close()
        except PermissionError:
            return candidate
        except OSError:
            continue
    pytest.skip("no write-only kernel file here to stand for an unreadable mount table")


@pytest.fixture
def namespaced(root: Path) -> Iterator[DaemonProcess]:
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} (util-linux) is not installed")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.strip()}")
    daemon = DaemonProcess(root, launcher=["unshare", "-m", "--propagation", "private"])
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.close()


def _in_namespace(daemon: DaemonProcess, *argv: str) -> None:
    subprocess.run(["nsenter", "-t", str(daemon.pid), "-m", *argv], check=True)


def test_discard_kept_holds_when_the_mount_table_is_unreadable(
    namespaced: DaemonProcess, tmp_short: Path
) -> None:
    daemon = namespaced
    kept = kept_env_copy(daemon, tmp_short)
    # The Linux backend reads mountinfo; the portable one psutil's partitions, from mounts.
    tables = [f"/proc/{daemon.pid}/mountinfo", f"/proc/{daemon.pid}/mounts"]
    for table in tables:
        _in_namespace(daemon, "mount", "--bind", str(_unreadable_file()), table)
    try:
        err = rpc_error(daemon, "workspace.discard_kept", {"path": str(kept)})
        assert err.kind == ErrorKind.BUSY.value, err
        assert [(h["kind"], h["pid"]) for h in err.data["holders"]] == [("probe", None)]
        assert "mount table unreadable" in err.message
        assert (kept / "files" / ".env").read_text() == "KEY=1\n"  # nothing deleted
    finally:
        for table in tables:
            _in_namespace(daemon, "umount", table)
    # Readable again: the same request goes through.
    assert daemon.call("workspace.discard_kept", {"path": str(kept)})["path"] == str(kept)
    assert not kept.exists()
