"""The SIGKILL matrix: for every fault point the daemon declares (`xumd --list-fault-points`),
start a real daemon with it armed, drive the operation that reaches it, see the daemon die by
SIGKILL, restart, and check the invariants; then complete or undo the operation with ordinary
calls and check them again. A point with no driver fails the test: coverage is automatic."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.crash.at_kill import covered_points, order_problems
from tests.crash.drivers import driver_for
from tests.crash.invariants import check, resolve
from tests.crash.world import World


def fault_points() -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "xumd", "--list-fault-points"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


POINTS = fault_points()


def test_every_point_has_a_driver() -> None:
    missing = [p for p in POINTS if driver_for(p) is None]
    assert not missing, f"fault points with no crash driver (add one in tests/crash): {missing}"
    # The structural operations each have at least one point.
    for prefix in (
        "workspace.create.",
        "workspace.rename.",
        "workspace.archive.",
        "workspace.unarchive.",
        "workspace.remove.",
        "turn.create.",
        "cleanup.",
        "recovery.",
    ):
        assert any(p.startswith(prefix) for p in POINTS), f"no fault point for {prefix}"
    # Every point the at-the-kill order check knows is still declared (no stale name).
    assert set(covered_points()) <= set(POINTS), set(covered_points()) - set(POINTS)


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_at(point: str, world: World) -> None:
    driver = driver_for(point)
    assert driver is not None, f"no driver for fault point {point}"
    run = driver(world, point)
    assert f"fault point {point} reached" in world.d.log_text()
    problems = order_problems(world, point, run.subject)
    assert not problems, "\n".join(problems)
    world.start()
    problems = check(world, run.before, where=f"{point}: after restart")
    assert not problems, "\n".join(problems)
    resolve(world)
    run.finish(world)
    world.finish_cleanup()
    problems = check(world, run.before, where=f"{point}: after the user finished")
    assert not problems, "\n".join(problems)
    assert not [w for w in world.workspaces() if w["interrupted"]]
