"""Process identity across wall-clock steps.

A lease's holder is identified by pid and start time. psutil's create_time adds the kernel's
current idea of the boot's wall-clock time, which moves with every step of the wall clock: after
a one-hour step across a restart, a live holder looked like a reused pid, its lease was dropped,
and the workspace was archived under it. The start time is now the start in clock ticks since
boot added to a boot anchor fixed once per boot (ROOT/boot-anchor, with the boot id).

The machine's own clock is shared and not ours to step; the step is reproduced the way it was
found: the stored timestamps (the lease's start time and the anchor of that boot) are what a
daemon would have recorded with its wall clock an hour ahead, and the restarted daemon must still
see the holder alive. A restart in a real time namespace (`unshare -T`, a boot-time offset of an
hour) checks the tick normalisation with a real kernel."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from xumd.system import procstat
from xumd.system.platform import linux

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project, create, rpc_error

HOUR = 3600.0


@pytest.fixture
def holder(tmp_short: Path) -> Iterator[subprocess.Popen[bytes]]:
    # The user's editor in the checkout: a real process that keeps running across the restart.
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True, cwd=tmp_short)
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _leased_workspace(
    daemon: DaemonProcess, tmp_short: Path, holder: subprocess.Popen[bytes]
) -> dict[str, Any]:
    repo = make_repo(tmp_short / "repo")
    project = add_project(daemon, repo)
    ws: dict[str, Any] = create(daemon, project["id"], "held")["workspace"]
    lease = daemon.call(
        "lease.acquire",
        {"workspace_id": ws["id"], "kind": "editor", "pid": holder.pid, "label": "vim"},
    )["lease"]
    assert lease["live"] and lease["pid"] == holder.pid
    return ws


def _shift_recorded_times(root: Path, seconds: float) -> None:
    """What a daemon would have written with its wall clock `seconds` ahead of now."""
    db = sqlite3.connect(root / "state.db")
    try:
        db.execute(
            "UPDATE leases SET start_time = start_time + ?, owner_start = owner_start + ?",
            (seconds, seconds),
        )
        # An external holder is named by its pid and start time (`lease.acquire`).
        db.execute(
            "UPDATE leases SET holder = printf('pid:%d:%.3f', pid, start_time) "
            "WHERE holder LIKE 'pid:%'"
        )
        db.commit()
    finally:
        db.close()
    anchor = root / "boot-anchor"
    boot, btime = anchor.read_text().split()
    anchor.write_text(f"{boot} {float(btime) + seconds!r}\n")


def test_boot_anchor_is_kept_for_this_boot_and_renewed_after_a_reboot(tmp_short: Path) -> None:
    path = tmp_short / "boot-anchor"
    first = procstat.anchor_boot(path)
    boot = linux.boot_id()
    assert boot is not None and path.read_text().split() == [boot, repr(first)]
    path.write_text(f"{boot} {first + HOUR!r}\n")  # written in this boot: kept as it is
    assert procstat.anchor_boot(path) == first + HOUR
    started = procstat.start_time(os.getpid())
    assert started is not None and procstat.same_process_alive(os.getpid(), started)
    path.write_text(f"another-boot {first + HOUR!r}\n")  # a previous boot's: renewed
    assert procstat.anchor_boot(path) == first
    assert path.read_text().split() == [boot, repr(first)]
    # The same process, one anchor earlier: not the same start (a reboot is never life).
    assert not procstat.same_process_alive(os.getpid(), started)


def test_live_lease_survives_a_wall_clock_step_across_a_restart(
    root: Path, tmp_short: Path, holder: subprocess.Popen[bytes]
) -> None:
    daemon = DaemonProcess(root).start()
    try:
        ws = _leased_workspace(daemon, tmp_short, holder)
        daemon.terminate()
        _shift_recorded_times(root, HOUR)  # recorded while the clock was an hour ahead
        daemon.start()
        leases = daemon.call("lease.list", {"workspace_id": ws["id"]})["leases"]
        assert [(x["pid"], x["live"]) for x in leases] == [(holder.pid, True)]
        err = rpc_error(daemon, "workspace.archive", {"workspace_id": ws["id"]})
        assert err.kind == "busy", err
        assert holder.pid in [h.get("pid") for h in err.data["holders"]]
        assert Path(ws["path"]).is_dir()
        # The holder goes: now, and only now, the lease is reclaimed and the archive runs.
        holder.kill()
        holder.wait(10)
        done = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        assert done["workspace"]["state"] == "archived"
    finally:
        daemon.close()


def test_lease_acquire_after_a_step_since_the_anchor_accepts_live_pids(
    root: Path,
    tmp_short: Path,
    holder: subprocess.Popen[bytes],
    started_procs: list[subprocess.Popen[bytes]],
) -> None:
    # The wall clock stepped back an hour after this boot's anchor was fixed: the kernel's
    # boot time (psutil's create_time) moved by the step, the anchor and the recorded times
    # did not. Acquiring after the step: the holder leased before it is the same holder (its
    # lease, live, not a second one), and a process started after it is accepted and live.
    daemon = DaemonProcess(root).start()
    try:
        ws = _leased_workspace(daemon, tmp_short, holder)
        before = daemon.call("lease.list", {"workspace_id": ws["id"]})["leases"]
        daemon.terminate()
        _shift_recorded_times(root, HOUR)  # the anchor and the lease, from before the step
        daemon.start()
        again = daemon.call(
            "lease.acquire",
            {"workspace_id": ws["id"], "kind": "editor", "pid": holder.pid, "label": "vim"},
        )
        assert again["created"] is False and again["lease"]["live"], again
        assert again["lease"]["id"] == before[0]["id"]
        later = subprocess.Popen(["sleep", "600"], start_new_session=True, cwd=tmp_short)
        started_procs.append(later)
        fresh = daemon.call(
            "lease.acquire",
            {"workspace_id": ws["id"], "kind": "tool", "pid": later.pid, "label": "tool"},
        )
        assert fresh["created"] and fresh["lease"]["live"], fresh
        listed = daemon.call("lease.list", {"workspace_id": ws["id"]})
        assert listed["reclaimed"] == []
        assert sorted((x["pid"], x["live"]) for x in listed["leases"]) == sorted(
            [(holder.pid, True), (later.pid, True)]
        )
        err = rpc_error(daemon, "workspace.archive", {"workspace_id": ws["id"]})
        assert err.kind == "busy", err
    finally:
        daemon.close()


UNSHARE = shutil.which("unshare")


def _time_namespaces_work() -> str | None:
    if UNSHARE is None:
        return "unshare (util-linux) is not installed"
    done = subprocess.run(
        [UNSHARE, "-T", "--boottime", "3600", "cat", "/proc/self/timens_offsets"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or "3600" not in done.stdout:
        return f"time namespaces are not permitted here: {done.stderr.strip()[:200]}"
    return None


def test_live_lease_survives_a_restart_in_another_time_namespace(
    root: Path, tmp_short: Path, holder: subprocess.Popen[bytes]
) -> None:
    why = _time_namespaces_work()
    if why:
        pytest.skip(why)
    assert UNSHARE is not None
    daemon = DaemonProcess(root).start()
    try:
        ws = _leased_workspace(daemon, tmp_short, holder)
        daemon.terminate()
    finally:
        daemon.close()
    # Its /proc/PID/stat start times read an hour later, its /proc/stat boot time an hour
    # earlier: the identity must not move.
    shifted = DaemonProcess(
        root, launcher=[UNSHARE, "-T", "--boottime", "3600", "--kill-child=TERM", "--"]
    )
    shifted.start()
    try:
        leases = shifted.call("lease.list", {"workspace_id": ws["id"]})["leases"]
        assert [(x["pid"], x["live"]) for x in leases] == [(holder.pid, True)]
        err = rpc_error(shifted, "workspace.archive", {"workspace_id": ws["id"]})
        assert err.kind == "busy", err
    finally:
        shifted.close()


def test_a_start_time_recorded_before_the_anchor_still_reads(
    tmp_short: Path, holder: subprocess.Popen[bytes]
) -> None:
    # Leases written by an older daemon carry psutil's create_time; the clock did not step
    # since, so the anchored identity must read them as the same process.
    import psutil

    legacy = psutil.Process(holder.pid).create_time()
    procstat.anchor_boot(tmp_short / "boot-anchor")
    assert procstat.same_process_alive(holder.pid, legacy)
    assert not procstat.same_process_alive(holder.pid, legacy - 1.0)  # another start: not it
    holder.kill()
    holder.wait(10)
    assert not procstat.same_process_alive(holder.pid, legacy)


@pytest.mark.parametrize("read", [linux.stat_fields, procstat.identity])
@pytest.mark.parametrize(
    ("error", "lenient", "strict"),
    [
        (errno.ENOENT, None, None),  # no such process: gone, in both modes
        (errno.ESRCH, None, None),  # the process went while its stat was read: gone
        (errno.EACCES, None, "raises"),  # could not read: "gone" only when not strict
        (errno.EMFILE, "raises", "raises"),  # out of descriptors: never "gone"
        (errno.ENOBUFS, "raises", "raises"),  # out of kernel memory (fdlimits.EXHAUSTED)
    ],
)
def test_a_stat_read_that_fails_is_gone_only_when_the_process_is(
    monkeypatch: pytest.MonkeyPatch,
    read: Callable[..., object],
    error: int,
    lenient: str | None,
    strict: str | None,
) -> None:
    """`stat_fields` and `identity` (built on it): a process whose /proc/PID/stat is missing
    is gone; one whose read failed for want of descriptors or memory is not (fail closed), and
    with `strict` (containment) neither is one whose read failed for any other reason."""

    def failing(path: str, *args: Any, **kwargs: Any) -> Any:
        raise OSError(error, os.strerror(error), path)

    monkeypatch.setattr(linux, "open", failing, raising=False)
    for mode, expected in ((False, lenient), (True, strict)):
        if expected == "raises":
            with pytest.raises(OSError):
                read(os.getpid(), strict=mode)
        else:
            assert read(os.getpid(), strict=mode) is None
