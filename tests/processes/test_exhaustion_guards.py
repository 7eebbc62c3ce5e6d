"""Out of descriptors where a probe must look (fail-closed paths): the
supervisor's liveness sweep under a real RLIMIT_NOFILE exhaustion of a real daemon, and the
quiescence probe when EMFILE hits inside the look at one process."""

from __future__ import annotations

import errno
import os
import resource
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.processes.test_support import Harness, external_processes, insert_workspace, running
from tests.support.daemon import DaemonProcess, write_config
from tests.support.wait import until

external = pytest.fixture(external_processes, name="external")


@contextmanager
def descriptors_exhausted(pid: int) -> Iterator[Callable[[], None]]:
    """Lower `pid`'s soft RLIMIT_NOFILE to the descriptors it has open: its next open, socket
    or pipe fails with a real EMFILE. Yields `tighten`, which lowers it again to what is open
    then (a descriptor the process closed meanwhile would otherwise be a free slot). The old
    limit is put back at exit."""
    old = resource.prlimit(pid, resource.RLIMIT_NOFILE)

    def tighten() -> None:
        in_use = len(os.listdir(f"/proc/{pid}/fd"))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use, old[1]))

    tighten()
    try:
        yield tighten
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, old)


def _skips(daemon: DaemonProcess, tighten: Callable[[], None]) -> int:
    tighten()
    return daemon.log_text().count('"process.probe_skipped"')


def _lease_holders(root: Path) -> list[int]:
    with sqlite3.connect(root / "state.db") as db:
        return [pid for (pid,) in db.execute("SELECT pid FROM leases")]


def test_liveness_sweep_out_of_descriptors_holds_and_lives_on(
    tmp_short: Path, external: list[subprocess.Popen[bytes]]
) -> None:
    """The sweep reads /proc to decide whether a lease's holder lives. With no descriptor
    left it can decide nothing: it reclaims nothing (fail closed), logs that it skipped, and
    the supervisor goes on sweeping once descriptors are back (it does not die with the
    daemon's process loop)."""
    root = tmp_short / "root"
    write_config(root, "[processes]\nprobe_interval_s = 0.05\n")
    ws = insert_workspace(root, tmp_short / "checkouts" / "w")
    daemon = DaemonProcess(root).start()
    try:
        # An external lease: its liveness is only known by a probe of /proc.
        editor = subprocess.Popen(["sleep", "60"], start_new_session=True)
        external.append(editor)
        daemon.call(
            "lease.acquire",
            {"workspace_id": ws, "kind": "editor", "pid": editor.pid, "label": "vim"},
        )
        with descriptors_exhausted(daemon.pid) as tighten:
            until(lambda: _skips(daemon, tighten) >= 1, message="a sweep out of descriptors")
            editor.kill()
            editor.wait()
            # The holder is gone, but no sweep can see it: its lease stays (never dropped
            # for a look that could not be made).
            skipped = _skips(daemon, tighten)
            until(
                lambda: _skips(daemon, tighten) >= skipped + 2,
                message="more sweeps out of descriptors",
            )
            assert _lease_holders(root) == [editor.pid]
        assert daemon.proc is not None and daemon.proc.poll() is None, daemon.log_text()
        # Descriptors are back: the next sweep sees the holder gone and reclaims its lease.
        until(
            lambda: daemon.call("lease.list", {"workspace_id": ws})["leases"] == [],
            message="the dead holder's lease reclaimed",
        )
    finally:
        daemon.close()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_quiescence_out_of_descriptors_inside_a_process_never_says_nobody(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    external: list[subprocess.Popen[bytes]],
    anyio_backend: str,
) -> None:
    """A process with a file open in the checkout (its cwd elsewhere) is found only by listing
    its open files. When that listing fails for want of descriptors (the fault: EMFILE from
    the read of /proc/PID/fd; a real exhaustion would fail the whole scan before it), the
    probe raises instead of going on as if that process used nothing: the caller answers out
    of descriptors, never "nobody holds it"."""
    async with running(Harness(tmp_path)) as h:
        ref = h.workspace()
        (ref.path / "notes.txt").write_text("x")
        opener = subprocess.Popen(
            [
                "python3",
                "-c",
                "import sys, time; f = open(sys.argv[1]); print(1, flush=True); time.sleep(60)",
                str(ref.path / "notes.txt"),
            ],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        external.append(opener)
        assert opener.stdout is not None and opener.stdout.readline() == b"1\n"  # it is open
        holders = await h.quiet.holders(ref)
        assert opener.pid in {x.pid for x in holders}

        # The fault where the probe lists that process's descriptors: /proc/PID/fd read
        # directly, or psutil's open_files where there is no /proc to read.
        listdir = os.listdir
        fds_of_opener = f"/proc/{opener.pid}/fd"

        def listdir_exhausted(path: Any = ".") -> list[str]:
            if str(path) == fds_of_opener:
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            return listdir(path)

        def exhausted(self: psutil.Process) -> Any:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

        monkeypatch.setattr(psutil.Process, "open_files", exhausted)
        monkeypatch.setattr(os, "listdir", listdir_exhausted)
        with pytest.raises(OSError) as failed:
            await h.quiet.holders(ref)
        assert failed.value.errno == errno.EMFILE
