"""`xumd.system.procstat` in-process: liveness by identity, driven with real processes.

Children spawned here (sleeping, exited and not reaped: zombies, exited and reaped), a child
whose command name holds `) (` and spaces, a real time namespace with a boot-time offset; faults
only where the kernel cannot be made to produce them (a short or failing /proc read). Fast: the
mutation selection of procstat.py (`mutation/run.py`) runs this file for each mutant.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from xumd.system import platform, procstat
from xumd.system.platform import linux, portable

from tests.support.wait import until


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


@pytest.fixture
def kernel_anchor(monkeypatch: pytest.MonkeyPatch) -> float:
    """The anchor as a daemon that never stepped its clock has it: the kernel's boot time."""
    anchor = linux.kernel_boot_time()
    monkeypatch.setattr(procstat, "_boot_anchor", anchor)
    return anchor


def _state(pid: int) -> str | None:
    fields = linux.stat_fields(pid)
    return fields[0] if fields else None


def _psutil_ticks_s(pid: int) -> float:
    """The process's start in seconds since boot, by psutil (an independent reader)."""
    proc = psutil.Process(pid)
    return float(proc.create_time() - psutil.boot_time())


def test_a_running_child_is_itself_and_not_a_zombie(
    sleeper: subprocess.Popen[bytes], kernel_anchor: float
) -> None:
    found = procstat.identity(sleeper.pid)
    assert found is not None
    started, zombie = found
    assert zombie is False
    # The start time agrees with psutil's reading of the same process (same boot time).
    assert abs(started - psutil.Process(sleeper.pid).create_time()) < 0.02
    assert procstat.start_time(sleeper.pid) == started
    assert procstat.same_process_alive(sleeper.pid, started)
    assert procstat.same_process_alive(sleeper.pid, None)  # no recorded start: the pid's life
    # A stale start time (the pid's earlier holder, or a later one): not this process.
    assert not procstat.same_process_alive(sleeper.pid, started - 1.0)
    assert not procstat.same_process_alive(sleeper.pid, started + 1.0)
    assert not procstat.same_process_alive(sleeper.pid, started + 0.2)
    # Within the tolerance (older records' rounding): the same process.
    assert procstat.same_process_alive(sleeper.pid, started + procstat.START_TOLERANCE_S / 2)
    assert procstat.same_process_alive(sleeper.pid, started - procstat.START_TOLERANCE_S / 2)


def test_a_zombie_is_not_alive_and_a_reaped_child_is_gone(kernel_anchor: float) -> None:
    proc = subprocess.Popen(["true"])
    try:
        until(lambda: _state(proc.pid) == "Z", message="the child to exit unreaped")
        found = procstat.identity(proc.pid)
        assert found is not None
        started, zombie = found
        assert zombie is True
        assert procstat.start_time(proc.pid) == started  # it still has its identity
        assert not procstat.same_process_alive(proc.pid, started)
        assert not procstat.same_process_alive(proc.pid, None)
    finally:
        proc.wait(10)
    # Reaped: no such process (its pid, checked with its old start time, is not alive).
    if linux.stat_fields(proc.pid) is None:  # unless the pid was reused at once
        assert procstat.identity(proc.pid) is None
        assert procstat.start_time(proc.pid) is None
    assert not procstat.same_process_alive(proc.pid, started)


def test_pids_that_name_no_process() -> None:
    for pid in (0, -1, -4242):
        assert procstat.identity(pid) is None
        assert procstat.start_time(pid) is None
        assert not procstat.same_process_alive(pid, None)
    assert linux.stat_fields(-1) is None
    # pid 1 does exist (init of this machine or container).
    assert procstat.identity(1) is not None
    assert procstat.same_process_alive(1, None)


def test_the_kernels_create_time_is_psutils_and_none_without_a_process() -> None:
    """What the root lock records of its holder (`kernel_create_time`): psutil's create_time to
    the tick, for this process and a child, on the kernel's boot time (not the anchor); no
    process, no time."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for pid in (os.getpid(), child.pid):
            assert procstat.kernel_create_time(pid) == pytest.approx(
                psutil.Process(pid).create_time(), abs=1e-6
            )
    finally:
        child.kill()
        child.wait()
    assert procstat.kernel_create_time(child.pid) is None
    assert procstat.kernel_create_time(0) is None


def test_a_command_name_with_parentheses_and_spaces_is_skipped_whole(
    kernel_anchor: float,
) -> None:
    # The command name is the process's own to set: `) R 1 (` must not shift the fields.
    code = (
        "import sys\n"
        "open('/proc/self/comm', 'w').write('x) Z 1 (y')\n"
        "sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        raw = Path(f"/proc/{proc.pid}/stat").read_text()
        assert "(x) Z 1 (y)" in raw
        fields = linux.stat_fields(proc.pid)
        assert fields is not None
        assert fields[0] in ("R", "S", "D")  # the state letter, not a piece of the name
        assert fields[1] == str(os.getpid())  # the parent
        found = procstat.identity(proc.pid)
        assert found is not None and found[1] is False
        assert abs(found[0] - psutil.Process(proc.pid).create_time()) < 0.02
    finally:
        proc.kill()
        proc.wait(10)


def test_the_start_time_is_the_anchor_plus_ticks_to_the_millisecond(
    sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An anchor with sub-millisecond digits (a stored anchor is a float): the start is rounded
    # to 3 digits, never more or fewer.
    anchor = 1_000_000.0054
    monkeypatch.setattr(procstat, "_boot_anchor", anchor)
    started = procstat.start_time(sleeper.pid)
    assert started is not None
    assert abs(started - (anchor + _psutil_ticks_s(sleeper.pid))) <= 0.0006
    assert started == round(started, 3)
    # A daemon that never anchored takes the kernel's boot time at first use.
    monkeypatch.setattr(procstat, "_boot_anchor", None)
    again = procstat.start_time(sleeper.pid)
    assert procstat._boot_anchor == linux.kernel_boot_time()
    assert again is not None
    assert abs(again - psutil.Process(sleeper.pid).create_time()) < 0.02


def test_boot_id_is_the_kernels_and_none_when_unreadable(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert linux.boot_id() == kernel
    empty = tmp_short / "empty"
    empty.write_text("\n")
    monkeypatch.setattr(linux, "_BOOT_ID", str(empty))
    assert linux.boot_id() is None
    monkeypatch.setattr(linux, "_BOOT_ID", str(tmp_short / "missing"))
    assert linux.boot_id() is None


@pytest.mark.parametrize(
    "stored",
    [
        "{boot} {anchor!r} extra\n",  # three fields: not ours
        "{boot}\n",  # one field
        "{boot} not-a-number\n",  # unreadable anchor
        "other-boot {anchor!r}\n",  # another boot's
    ],
)
def test_an_anchor_file_not_of_this_boot_is_renewed(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch, stored: str
) -> None:
    monkeypatch.setattr(procstat, "_boot_anchor", None)
    boot = linux.boot_id()
    kernel = linux.kernel_boot_time()
    path = tmp_short / "boot-anchor"
    path.write_text(stored.format(boot=boot, anchor=kernel + 3600.0))
    assert procstat.anchor_boot(path) == kernel
    assert procstat._boot_anchor == kernel
    assert path.read_text().split() == [boot, repr(kernel)]


def test_an_anchor_of_this_boot_is_kept(tmp_short: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procstat, "_boot_anchor", None)
    path = tmp_short / "boot-anchor"
    kept = linux.kernel_boot_time() + 3600.5
    path.write_text(f"{linux.boot_id()} {kept!r}\n")
    assert procstat.anchor_boot(path) == kept
    assert procstat._boot_anchor == kept


def test_without_a_boot_id_the_anchor_is_the_kernels_and_not_written(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No boot id: a stored anchor cannot be known to be this boot's; none is stored either.
    monkeypatch.setattr(linux, "_BOOT_ID", str(tmp_short / "missing"))
    monkeypatch.setattr(procstat, "_boot_anchor", None)
    path = tmp_short / "boot-anchor"
    path.write_text(f"None {linux.kernel_boot_time() + 3600.0!r}\n")
    before = path.read_text()
    assert procstat.anchor_boot(path) == linux.kernel_boot_time()
    assert path.read_text() == before
    fresh = tmp_short / "fresh-anchor"
    assert procstat.anchor_boot(fresh) == linux.kernel_boot_time()
    assert not fresh.exists()


def test_an_anchor_that_cannot_be_saved_still_anchors(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its directory is gone (as root, permissions would not stop the write): logged, not fatal.
    monkeypatch.setattr(procstat, "_boot_anchor", None)
    path = tmp_short / "gone" / "boot-anchor"
    assert procstat.anchor_boot(path) == linux.kernel_boot_time()
    assert not path.parent.exists()


@pytest.mark.parametrize("error", [errno.EACCES, errno.EIO])
def test_by_default_a_read_that_fails_is_no_process(
    monkeypatch: pytest.MonkeyPatch, error: int
) -> None:
    # Lenient unless asked (`strict`): liveness checks and probes take "could not read" as
    # gone; only descriptor or memory exhaustion raises (test_identity.py).
    def failing(path: str, *args: Any, **kwargs: Any) -> Any:
        raise OSError(error, os.strerror(error), path)

    monkeypatch.setattr(linux, "open", failing, raising=False)
    pid = os.getpid()
    assert linux.stat_fields(pid) is None
    assert procstat.identity(pid) is None
    assert procstat.start_time(pid) is None
    assert not procstat.same_process_alive(pid, None)


def _short_stat(monkeypatch: pytest.MonkeyPatch, real: list[str], keep: int) -> None:
    """A /proc/PID/stat cut after `keep` fields (a kernel never writes one: a fault)."""
    monkeypatch.setattr(linux, "stat_fields", lambda *_a, **_k: real[:keep])


def test_a_short_stat_line_on_linux_is_no_process(
    sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch, kernel_anchor: float
) -> None:
    full = procstat.identity(sleeper.pid)
    real = linux.stat_fields(sleeper.pid)
    assert real is not None and len(real) > 20
    _short_stat(monkeypatch, real, 20)  # field 19 (start) is the last one: enough
    assert procstat.identity(sleeper.pid) == full
    _short_stat(monkeypatch, real, 19)
    assert procstat.identity(sleeper.pid) is None


def test_elsewhere_than_linux_psutil_answers(
    sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The portable backend has no /proc/PID/stat: psutil's create_time, the best there is.
    monkeypatch.setattr(platform, "_current", portable)
    monkeypatch.setattr(procstat, "_boot_anchor", psutil.boot_time())
    monkeypatch.setattr(linux, "stat_fields", lambda *_a, **_k: None)
    found = procstat.identity(sleeper.pid)
    assert found is not None and found[1] is False
    assert found[0] == pytest.approx(psutil.Process(sleeper.pid).create_time(), abs=1e-6)
    zombie = subprocess.Popen(["true"])
    try:
        until(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE)
        found = procstat.identity(zombie.pid)
        assert found is not None and found[1] is True
    finally:
        zombie.wait(10)
    missing = _a_free_pid()
    assert procstat.identity(missing) is None


def _a_free_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait(10)
    until(lambda: not psutil.pid_exists(proc.pid) or _state(proc.pid) is None)
    return proc.pid


@pytest.mark.parametrize("content", [None, "boottime 12\n"])
def test_an_unreadable_time_namespace_offset_is_zero(
    monkeypatch: pytest.MonkeyPatch, tmp_short: Path, content: str | None
) -> None:
    offsets = tmp_short / "timens_offsets"
    if content is not None:
        offsets.write_text(content)
    real_open = open

    def redirect(path: Any, *args: Any, **kwargs: Any) -> Any:
        if path == "/proc/self/timens_offsets":
            path = offsets
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(linux, "open", redirect, raising=False)
    uncached = linux.timens_boottime_offset.__wrapped__
    assert uncached() == 0.0
    offsets.write_text("monotonic 7 0\nboottime 5 250000000\n")
    assert uncached() == 5.25


# Runs in a new time namespace (a boot-time offset of 3600.5 s, set through
# /proc/self/timens_offsets before the child enters it; `unshare --boottime` takes whole
# seconds only): the child's /proc/PID/stat start times read 3600.5 s later.
_IN_TIME_NAMESPACE = """
import ctypes, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x80) != 0:  # CLONE_NEWTIME
    sys.exit("unshare: errno %d" % ctypes.get_errno())
with open("/proc/self/timens_offsets", "w") as handle:
    handle.write("boottime 3600 500000000\\n")
sys.exit(subprocess.run(sys.argv[1:]).returncode)
"""

_PROBE = """
import json, sys
from pathlib import Path
from xumd.system import procstat
from xumd.system.platform import linux
procstat.anchor_boot(Path(sys.argv[1]))
print(json.dumps([procstat.start_time(int(sys.argv[2])), linux.timens_boottime_offset()]))
"""


def test_a_start_time_read_in_another_time_namespace_is_the_same(
    sleeper: subprocess.Popen[bytes], tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not Path("/proc/self/timens_offsets").exists():
        pytest.skip("no time namespaces in this kernel")
    monkeypatch.setattr(procstat, "_boot_anchor", None)
    path = tmp_short / "boot-anchor"
    procstat.anchor_boot(path)
    here = procstat.start_time(sleeper.pid)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _IN_TIME_NAMESPACE,
            sys.executable,
            "-c",
            _PROBE,
            str(path),
            str(sleeper.pid),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0 and "unshare: errno" in done.stderr:
        pytest.skip(f"time namespaces are not permitted here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    there, offset = json.loads(done.stdout)
    assert offset == 3600.5
    assert here is not None and there is not None
    assert abs(there - here) < procstat.START_TOLERANCE_S


_FAMILY = """
import subprocess, sys
b = subprocess.Popen(["sleep", "600"])
grandchild = (
    "import subprocess; g = subprocess.Popen(['sleep', '600']); print(g.pid, flush=True); g.wait()"
)
a = subprocess.Popen(
    [sys.executable, "-c", grandchild], stdout=subprocess.PIPE, start_new_session=True
)
grand = a.stdout.readline().strip().decode()
print(a.pid, grand, b.pid, flush=True)
a.wait()
"""


@pytest.fixture
def family() -> Iterator[tuple[int, int, int, int]]:
    """(root, a, grandchild, b): root's child `a` has a session (and group) of its own and a
    child of its own; `b` is root's plain child. Each killed at the end."""
    root = subprocess.Popen(
        [sys.executable, "-c", _FAMILY], stdout=subprocess.PIPE, start_new_session=True
    )
    members: list[int] = [root.pid]
    try:
        assert root.stdout is not None
        a, grand, b = (int(p) for p in root.stdout.readline().split())
        members += [a, grand, b]
        until(lambda: linux.stat_fields(grand) is not None, message="the grandchild")
        yield root.pid, a, grand, b
    finally:
        for pid in reversed(members):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        root.wait(10)


def _expected(*pids: int) -> dict[int, float | None]:
    return {pid: procstat.start_time(pid) for pid in pids}


def test_tree_identities_is_the_root_and_every_descendant_with_its_start_time(
    family: tuple[int, int, int, int],
) -> None:
    """By parent (not by group or session: `a` has its own), each with the start time
    `start_time` reads."""
    root, a, grand, b = family
    assert procstat.tree_identities(root) == _expected(root, a, grand, b)
    assert procstat.tree_identities(a) == _expected(a, grand)
    assert procstat.tree_identities(_a_free_pid()) == {}
    assert procstat.tree_identities(0) == {}
    assert 1 in procstat.tree_identities(1)  # pid 1 is a process like any other


def test_tree_identities_skips_a_pid_gone_mid_scan_and_a_short_stat_line(
    family: tuple[int, int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that ends between the listing of /proc and the read of its stat is skipped
    and the scan goes on; a stat line cut short of the start time (a fault) is no member, and
    neither is what hangs below it."""
    root, a, grand, b = family
    real = linux.stat_fields
    gone: list[int] = []

    def scan(pid: int, *, strict: bool = False) -> list[str] | None:
        if not gone and pid not in (root, a, grand, b):
            gone.append(pid)  # the first one read, ended meanwhile
            return None
        fields = real(pid, strict=strict)
        return None if fields is None else fields[:20]  # the start time is the last one

    monkeypatch.setattr(linux, "stat_fields", scan)
    assert procstat.tree_identities(root) == _expected(root, a, grand, b)
    assert gone

    def cut(pid: int, *, strict: bool = False) -> list[str] | None:
        fields = real(pid, strict=strict)
        return None if fields is None else fields[:19] if pid == a else fields

    monkeypatch.setattr(linux, "stat_fields", cut)
    assert procstat.tree_identities(root) == _expected(root, b)


def test_tree_identities_never_loops_on_a_parent_that_names_a_descendant(
    family: tuple[int, int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pid reused during the scan can make the parents form a loop (here: root's parent
    read as one of its own children). The walk visits each pid once and still finds every
    other member."""
    root, a, grand, b = family
    real = linux.stat_fields
    last = max(a, b)  # /proc lists pids in order: the child the walk takes first

    def looped(pid: int, *, strict: bool = False) -> list[str] | None:
        fields = real(pid, strict=strict)
        if fields is not None and pid == root:
            fields = [fields[0], str(last), *fields[2:]]
        return fields

    monkeypatch.setattr(linux, "stat_fields", looped)
    assert procstat.tree_identities(root) == _expected(root, a, grand, b)


def test_without_a_listing_of_proc_or_elsewhere_the_tree_is_psutils(
    family: tuple[int, int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, a, grand, b = family
    real_listdir = os.listdir

    def no_proc(path: Any = ".") -> list[str]:
        if str(path) == "/proc":
            raise PermissionError(errno.EACCES, "denied", "/proc")
        return real_listdir(path)

    monkeypatch.setattr(linux.os, "listdir", no_proc)
    assert procstat.tree_identities(root) == _expected(root, a, grand, b)
    monkeypatch.undo()
    monkeypatch.setattr(platform, "_current", portable)
    assert procstat.tree_identities(root) == _expected(root, a, grand, b)
    assert procstat.tree_identities(_a_free_pid()) == {}
