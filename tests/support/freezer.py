"""A process that SIGKILL cannot end yet: frozen by the cgroup v1 freezer.

A task of a FROZEN v1 freezer cgroup stays (in D state) after SIGKILL until the cgroup is
thawed: a real stop whose exit cannot be confirmed in time, on demand, without a timing race.
(The v2 freezer lets SIGKILL through, so only v1 serves.)"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.cgroups import new_cgroup
from tests.support.wait import until

FREEZER = Path("/sys/fs/cgroup/freezer")


@contextmanager
def frozen(pid: int) -> Iterator[None]:
    """Freeze `pid` (moved into a new freezer cgroup); thawed and the cgroup removed at exit,
    also when the test fails. Skips where no v1 freezer is mounted or writable."""
    if not (FREEZER / "cgroup.procs").exists():
        pytest.skip("no cgroup v1 freezer mounted here (/sys/fs/cgroup/freezer)")
    group = new_cgroup(FREEZER)
    try:
        (group / "cgroup.procs").write_text(f"{pid}\n")
        (group / "freezer.state").write_text("FROZEN\n")
        until(
            lambda: (group / "freezer.state").read_text().strip() == "FROZEN",
            message=f"pid {pid} frozen",
        )
        yield
    finally:
        (group / "freezer.state").write_text("THAWED\n")
        # The thawed tasks leave (exit, or go back to the root group) before the group goes.
        for line in (group / "cgroup.procs").read_text().split():
            try:
                (FREEZER / "cgroup.procs").write_text(f"{line}\n")
            except OSError:
                continue  # it exited meanwhile
        until(lambda: _remove(group), message=f"{group} removed")


def _remove(group: Path) -> bool:
    try:
        os.rmdir(group)
    except OSError:
        return False
    return True
