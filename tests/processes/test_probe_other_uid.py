"""The quiescence probe and processes of another user (a real process as uid 65534).

A daemon that may read another user's /proc links (root) sees that user's process inside a
checkout: it is a holder, never skipped as "not ours" (removing the directory under it would
harm it). A daemon that may not (any other user) cannot see it: the probe neither fails nor
counts it, and still finds what it can see.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from xumd.processes import probes
from xumd.system.platform import linux, portable
from xumd.system.platform.common import PathUser

from tests.support.daemon import short_tmpdir
from tests.support.otheruser import NOBODY, as_nobody

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.isdir("/proc/self/fd"),
    reason="a process of another uid needs root to start (tests run as root in CI), and /proc",
)

# Shell, not Python: the test's interpreter may live under a 0700 home that `nobody` cannot enter.
HOLD = {
    "cwd": 'cd "$1" && echo ready && exec sleep 120',
    "file": 'exec 3>"$1/held-$$" && echo ready && exec sleep 120',
}


def _hold(
    started: list[subprocess.Popen[str]], where: Path, what: str, *, uid: int | None
) -> subprocess.Popen[str]:
    as_user: dict[str, object] = {}
    if uid is not None:
        as_user = {"user": uid, "group": uid, "extra_groups": []}
    proc = subprocess.Popen(  # type: ignore[call-overload]
        ["sh", "-c", HOLD[what], "sh", str(where)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd="/",
        **as_user,
    )
    started.append(proc)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n", "the holder did not start"
    return proc  # type: ignore[no-any-return]


def _shared_checkout() -> Path:
    """A checkout the other user may enter and write in (mkdtemp makes it 0700)."""
    checkout = short_tmpdir()
    checkout.chmod(0o777)
    return checkout


def test_a_readable_process_of_another_user_inside_is_a_holder(
    started_procs: list[subprocess.Popen[str]],
) -> None:
    checkout = _shared_checkout()
    in_cwd = _hold(started_procs, checkout, "cwd", uid=NOBODY)
    in_file = _hold(started_procs, checkout, "file", uid=NOBODY)
    found = probes.find_users(checkout, exclude_pids=set(), exclude_pgids=set())
    assert sorted((u.pid, u.where) for u in found) == sorted(
        [(in_cwd.pid, "cwd"), (in_file.pid, "open file")]
    ), "another user's process inside the checkout was skipped: a false quiet"
    old = portable.users_under(str(checkout.resolve()), set(), set(), 64)
    assert sorted((u.pid, u.where) for u in old) == sorted((u.pid, u.where) for u in found)


def test_a_probe_that_may_not_read_another_users_process_skips_it_and_finds_its_own(
    started_procs: list[subprocess.Popen[str]],
) -> None:
    """The probe itself runs as `nobody` (a daemon of an ordinary user): root's process inside
    is unreadable (EACCES on its cwd and fd links), so it is skipped without an error, and
    nobody's own process inside is still found, by both scans."""
    checkout = _shared_checkout()
    _hold(started_procs, checkout, "cwd", uid=None)  # root's: unreadable to nobody
    _hold(started_procs, checkout, "file", uid=None)
    mine = _hold(started_procs, checkout, "cwd", uid=NOBODY)
    root = str(checkout.resolve())
    scans: dict[str, Callable[[], list[PathUser]]] = {
        "/proc": lambda: linux.users_under(root, set(), set(), 64),
        "psutil": lambda: portable.users_under(root, set(), set(), 64),
    }
    for name, scan in scans.items():
        assert [(u.pid, u.where) for u in as_nobody(scan)] == [(mine.pid, "cwd")], name
