"""gc judges age by records' wall-clock stamps: a wall clock stepped ahead must not make a fresh
record old enough to collect, and one stepped back must not keep a record forever
(`GcClock`: the earlier of the wall and the boot-anchored clock; a record stamped after now is
skipped, naming the step, until the clock passes it).

The clock is the one thing a test may fake: the daemon's wall clock is stepped for real inside
the daemon process only (libfaketime, `LD_PRELOAD`, its monotonic and boot clocks left real),
the machine's clock is shared and never touched."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xumd.gc.plan import AHEAD_TOLERANCE_S, Plan
from xumd.gc.service import GcClock
from xumd.system import procstat

from tests.support.daemon import DaemonProcess, short_tmpdir, write_config
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project, create

DAY = 86400.0
LIBFAKETIME = next(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"), None)
POLICY = "enable_test_methods = true\n[gc]\narchived_after_days = 7\nsnapshot_refs_days = 30\n"


class Clocks:
    """A wall clock and a boot-anchored clock that both run with `real`; `step` moves only
    the wall clock, as settimeofday does."""

    def __init__(self) -> None:
        self.real = 1_000_000.0
        self.step_s = 0.0

    def wall(self) -> float:
        return self.real + self.step_s

    def anchored(self) -> float:
        return self.real


def test_a_step_ahead_does_not_age_anything_and_a_step_back_is_followed() -> None:
    clocks = Clocks()
    clock = GcClock(wall=clocks.wall, anchored=clocks.anchored)
    assert clock.time() == 1_000_000.0
    clocks.step_s = 0.9  # the anchor's whole-second rounding: not a step, the wall clock
    assert clock.time() == 1_000_000.9
    clocks.step_s = 10 * DAY  # ahead: the anchored clock keeps the true time
    assert clock.time() == 1_000_000.0
    clocks.real += 60
    assert clock.time() == 1_000_060.0  # and runs on with real time
    clocks.step_s = -3 * DAY  # back: the wall clock is the earlier one
    assert clock.time() == 1_000_060.0 - 3 * DAY
    assert clock.advance(DAY) == 1_000_060.0 - 2 * DAY  # the test offset on top


def test_the_anchored_clock_runs_with_the_wall_clock_when_nothing_stepped() -> None:
    # The anchor is /proc/stat's boot time in whole seconds: within a couple of seconds of
    # the wall clock on this machine (whose clock no test steps), never far ahead of it.
    import time

    gap = time.time() - procstat.anchored_now()
    assert -2.0 < gap < 2.0, gap


def test_a_stamp_after_now_is_named_and_one_within_the_anchor_s_rounding_is_not() -> None:
    plan = Plan(now=1_000_000.0)
    assert plan.ahead(1_000_000.0 + AHEAD_TOLERANCE_S) is None  # a stamp written this instant
    reason = plan.ahead(1_000_000.0 + 2 * 3600)
    assert reason is not None and "2.0 h after" in reason and "wall clock stepped" in reason


@pytest.fixture
def stepped_daemon() -> Iterator[tuple[DaemonProcess, Path, Path]]:
    if LIBFAKETIME is None:
        pytest.skip("libfaketime not installed (/usr/lib/*/faketime/; Debian package faketime)")
    tmp = short_tmpdir("xumgc-")
    spec = tmp / "faketime"
    spec.write_text("+0\n")
    env = {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME_TIMESTAMP_FILE": str(spec),
        "FAKETIME_NO_CACHE": "1",  # read the file on every call: a step lands at once
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # monotonic and boot clocks stay real
    }
    write_config(tmp / "root", POLICY)
    daemon = DaemonProcess(tmp / "root", env=env).start()
    try:
        yield daemon, spec, tmp
    finally:
        daemon.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _archived(daemon: DaemonProcess, tmp: Path, name: str) -> dict[str, Any]:
    project = add_project(daemon, make_repo(tmp / f"repo-{name}"))["id"]
    ws: dict[str, Any] = create(daemon, project, name, runtime="directory")["workspace"]
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    return ws


def _plan(daemon: DaemonProcess) -> tuple[dict[str, Any], dict[str, Any]]:
    plan = daemon.call("gc.plan")
    return {i["key"]: i for i in plan["items"]}, {s["key"]: s for s in plan["skipped"]}


def test_a_wall_clock_stepped_ahead_does_not_make_a_fresh_archive_collectable(
    stepped_daemon: tuple[DaemonProcess, Path, Path],
) -> None:
    daemon, spec, tmp = stepped_daemon
    ws = _archived(daemon, tmp, "fresh")
    key = f"remove_archived:{ws['id']}"
    assert key not in _plan(daemon)[0]
    # The daemon's wall clock jumps ten days ahead (policy: 7): the archive is minutes old.
    spec.write_text(f"+{10 * DAY:.0f}\n")
    items, skipped = _plan(daemon)
    assert key not in items and key not in skipped, (items, skipped)
    run = daemon.call("gc.run")
    assert run["done"] == [], run
    listed = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert listed["state"] == "archived"
    # Real time still counts: eight days later (the gc clock's test offset) it is collectable.
    daemon.call("test.clock_advance", {"seconds": 8 * DAY})
    items, _ = _plan(daemon)
    assert key in items and 7.9 < items[key]["age_days"] < 8.1, items


@pytest.mark.reliability  # ~8-14 s on the shared machine: the daemon under libfaketime is slow
def test_a_record_stamped_before_the_clock_stepped_back_is_skipped_then_aged(
    stepped_daemon: tuple[DaemonProcess, Path, Path],
) -> None:
    daemon, spec, tmp = stepped_daemon
    ws = _archived(daemon, tmp, "ahead")
    key = f"remove_archived:{ws['id']}"
    # And a removed workspace's snapshot ref (aged by its tombstone's stamp).
    project = add_project(daemon, make_repo(tmp / "repo-refs"))["id"]
    gone = create(daemon, project, "gone")["workspace"]
    (Path(gone["path"]) / "work.txt").write_text("saved in a snapshot\n")
    removed = daemon.call("workspace.remove", {"workspace_id": gone["id"], "force": True})
    ref_key = f"prune_snapshot_ref:{project}:{removed['snapshot']['ref']}"
    # The clock is set back ten days (it ran ahead; NTP corrects it): the archive's stamp is
    # now in the future. It is not collected, and the plan says why instead of hiding it.
    spec.write_text(f"-{10 * DAY:.0f}\n")
    items, skipped = _plan(daemon)
    assert key not in items
    assert "wall clock stepped" in skipped[key]["reason"], skipped
    assert "wall clock stepped" in skipped[ref_key]["reason"], skipped
    assert daemon.call("gc.run")["done"] == []
    # Not kept forever: once the clock passes the stamp it ages from there (here 18 days on:
    # 8 past the stamp, over the policy's 7).
    daemon.call("test.clock_advance", {"seconds": 18 * DAY})
    items, skipped = _plan(daemon)
    assert key in items and key not in skipped, (items, skipped)
    assert 7.9 < items[key]["age_days"] < 8.1
