"""Scheduling of cleanup retries with a fake clock: capped jittered backoff, a rotating cursor (a
target that keeps failing cannot starve another), no hot loop, and a bounded shutdown that kills a
teardown's whole process tree."""

from __future__ import annotations

import os
import random
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from xumd.cleanup.retry import RetryService
from xumd.cleanup.schedule import Backoff, StepWatch, SystemClock
from xumd.cleanup.service import CycleResult

from tests.cleanup.test_support import (
    FakeClock,
    ScriptTeardown,
    World,
    add_workspace,
    make_dir_checkout,
    make_world,
)
from tests.support.daemon import short_tmpdir
from tests.support.procs import alive, identify_all


@pytest.fixture
def base() -> Iterator[Path]:
    path = short_tmpdir("xums-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def plan_dir(world: World, wid: str, name: str) -> Path:
    inc = secrets.token_hex(8)
    path = world.root / "workspaces" / name
    ident = make_dir_checkout(path, wid, inc)
    add_workspace(world.app, world.project_id, wid, path, inc)
    world.plan(wid, path, inc, ident)
    return path


def test_backoff_is_exponential_capped_and_jittered() -> None:
    backoff = Backoff(1.0, 300.0, 0.2, random.Random(1))
    assert [backoff.base(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff.base(9) == 256.0 and backoff.base(10) == 300.0 and backoff.base(10_000) == 300.0
    delays = [backoff.delay(50) for _ in range(200)]
    assert all(240.0 <= d <= 300.0 for d in delays), "capped, jitter only shortens"
    assert len({round(d, 6) for d in delays}) > 150, "jittered: failures spread out"
    assert Backoff(1.0, 300.0, 0.0).delay(3) == 4.0


async def test_rotating_cursor_a_failing_target_cannot_starve_another(base: Path) -> None:
    # A (sorts first) fails forever; B succeeds. One target per cycle.
    world = make_world(base, None, batch_size=1, backoff_initial_s=1.0, backoff_jitter=0.0)
    a, b = "ws_" + "a" * 16, "ws_" + "b" * 16
    world.service.steps.teardown_fn = ScriptTeardown(
        f'[ "$XUM_WORKSPACE_ID" != "{a}" ] || {{ echo broken >&2; exit 1; }}'
    )
    plan_dir(world, a, "a")
    path_b = plan_dir(world, b, "b")
    first = await world.service.run_cycle("path")
    assert first.attempted == [a] and first.full
    world.clock.advance(5.0)  # both are due now (A's backoff has passed)
    second = await world.service.run_cycle("path")
    assert second.attempted == [b], "B is attempted before A is retried"
    assert world.states(b)["trash"] == "completed" and not path_b.exists()
    third = await world.service.run_cycle("path")
    assert third.attempted == [a]
    assert world.states(a)["teardown"] == "pending"


async def test_backoff_per_obligation_grows_and_never_hot_loops(base: Path) -> None:
    world = make_world(
        base,
        ScriptTeardown("exit 1"),
        backoff_initial_s=1.0,
        backoff_max_s=8.0,
        backoff_jitter=0.0,
        poll_interval_s=30.0,
    )
    retry = RetryService(world.service, world.clock)
    wid = "ws_" + "c" * 16
    plan_dir(world, wid, "c")
    start = world.clock.now
    gaps = []
    attempts_at = []
    for _ in range(8):
        result = await world.service.run_cycle("path")
        delay = retry.next_delay(result)
        assert delay > 0, "everything fails: the lane sleeps"
        attempts_at.append(world.clock.now)
        gaps.append(delay)
        again = await world.service.run_cycle("path")
        assert again.attempted == [], "a failed step is not due again at once"
        assert retry.next_delay(again) == pytest.approx(delay)
        world.clock.advance(delay)
    assert gaps == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0, 8.0]
    ob = world.service.obligations.for_workspace(wid)[0]
    assert ob.attempts == 8 and ob.last_error is not None
    assert world.clock.now - start == sum(gaps)


def test_next_delay_rules(base: Path) -> None:
    world = make_world(base, None, backoff_initial_s=0.5, poll_interval_s=30.0)
    retry = RetryService(world.service, world.clock)
    now = world.clock.now
    assert retry.next_delay(CycleResult(attempted=["w"], full=True, next_due=now)) == 0.0
    assert retry.next_delay(CycleResult(next_due=None)) == 30.0
    assert retry.next_delay(CycleResult(next_due=now + 1000)) == 30.0
    # Due but nothing could run (blocked, or run by a request): never a hot loop.
    assert retry.next_delay(CycleResult(skipped=1, full=True, next_due=now - 5)) == 0.5


async def test_startup_with_many_pending_returns_at_once(base: Path) -> None:
    """Discovery is a bounded query per cycle, never a scan on the readiness path."""
    world = make_world(base, ScriptTeardown("exit 1"), batch_size=4)
    with world.app.store.transaction():
        for i in range(2000):
            world.service.plan_checkout_removal(
                workspace_id=f"ws_{i:016x}",
                project_id=world.project_id,
                incarnation="i",
                runtime="directory",
                repo_path=world.repo,
                checkout=world.root / "workspaces" / f"w{i}",
                dev=1,
                ino=i,
                teardown=True,
            )
    started = time.perf_counter()
    targets = world.service.obligations.due_workspaces(
        world.clock.now, ("teardown",), after=None, limit=4
    )
    assert len(targets) == 4
    assert time.perf_counter() - started < 0.5
    assert world.service.summary().pending == 6000


async def test_shutdown_kills_a_hanging_teardown_tree_and_keeps_the_obligation(
    base: Path,
) -> None:
    pids = base / "pids"
    # The teardown and its child ignore SIGTERM and hang.
    teardown = ScriptTeardown(
        f"trap '' TERM; (trap '' TERM; sleep 300) & echo $! >> {pids}; echo $$ >> {pids}; wait",
        timeout_s=300,
        grace_s=0.5,
    )
    world = make_world(base, teardown)
    retry = RetryService(world.service, SystemClock())  # real processes, real time
    wid = "ws_" + "d" * 16
    path = plan_dir(world, wid, "d")
    async with anyio.create_task_group() as tg:
        tg.start_soon(retry.run)
        with anyio.fail_after(10):
            while not (pids.exists() and len(pids.read_text().split()) == 2):
                await anyio.sleep(0.02)
        procs = identify_all(map(int, pids.read_text().split()))  # both run: they hang
        started = time.monotonic()
        with anyio.fail_after(5):
            await retry.stop()
        took = time.monotonic() - started
    assert took < 4.0
    for proc in procs:
        assert not alive(proc), proc
    ob = world.service.obligations.for_workspace(wid)[0]
    assert ob.kind == "teardown" and ob.state == "pending" and ob.attempts == 0
    # Interrupted, not failed: due at once after a restart, saying why.
    assert ob.last_error is not None and "teardown was cut short" in ob.last_error
    assert ob.next_attempt_at <= time.time()
    assert path.is_dir()
    assert os.path.exists(path / ".xum-incarnation")


async def test_a_registry_change_wakes_the_service(base: Path) -> None:
    # Nothing would run on the timer (30s poll): only the workspace event can wake the lane.
    world = make_world(base, ScriptTeardown("true"), poll_interval_s=30.0)
    retry = RetryService(world.service, SystemClock())  # real sleeps, fake (frozen) due times
    wid = "ws_" + "e" * 16
    async with anyio.create_task_group() as tg:
        tg.start_soon(retry.run)
        await anyio.wait_all_tasks_blocked()  # the lanes ran their first (empty) cycle and wait
        cycles = retry.cycles
        path = plan_dir(world, wid, "e")
        world.app.events.publish("process.output", data="chatty")  # not a registry change
        await anyio.wait_all_tasks_blocked()  # whatever it woke has run and is waiting again
        assert retry.cycles == cycles and path.exists()
        world.app.events.publish("workspace.state_changed", workspace={"id": wid})
        with anyio.fail_after(5):
            while path.exists():
                await anyio.sleep(0.02)
        await retry.stop()
    assert world.states(wid)["trash"] == "completed"


class SteppingClock(FakeClock):
    """A fake clock whose wall time can step (settimeofday) while monotonic time only runs."""

    def __init__(self) -> None:
        super().__init__()
        self.wall_offset = 0.0

    def time(self) -> float:
        return self.now + self.wall_offset


async def test_a_wall_clock_step_back_does_not_delay_a_pending_retry(base: Path) -> None:
    # Retry times are persisted as wall-clock times; a step back of an hour while
    # the daemon runs made a retry due in 1 s wait an hour (until the hourly clamp).
    ctl = base / "ctl"
    ctl.mkdir()
    clock = SteppingClock()
    world = make_world(
        base,
        ScriptTeardown(f"test -e {ctl}/ok"),
        clock=clock,
        backoff_initial_s=1.0,
        backoff_jitter=0.0,
        poll_interval_s=30.0,
    )
    retry = RetryService(world.service, clock)
    wid = "ws_" + "f" * 16
    path = plan_dir(world, wid, "f")
    async with anyio.create_task_group() as tg:
        tg.start_soon(retry.run)
        with anyio.fail_after(10):
            while not world.service.obligations.for_workspace(wid)[0].attempts:
                await anyio.sleep(0.01)
        await anyio.wait_all_tasks_blocked()  # the teardown failed; the lane sleeps 1 s
        (ctl / "ok").touch()
        clock.wall_offset -= 3600.0  # the wall clock steps back an hour
        # Monotonic time runs on, a quarter second per poll: the retry (due 1 s after the
        # failure) comes within a few polls. Advancing in the loop, not once, so a lane that
        # computes its sleep just after one advance is not left waiting for a clock that stops;
        # a retry delayed by the step (an hour) is still never reached within the deadline.
        with anyio.fail_after(10):
            while path.exists():
                clock.advance(0.25)
                await anyio.sleep(0.02)
        await retry.stop()
    assert world.states(wid)["teardown"] == "completed"
    # Re-anchored, not clamped: the pending reclaim step keeps its own schedule.
    assert all(
        o.next_attempt_at is None or o.next_attempt_at < clock.time() + 60
        for o in world.service.obligations.for_workspace(wid)
        if o.state == "pending"
    )


def test_step_watch_sees_steps_not_slew() -> None:
    clock = SteppingClock()
    watch = StepWatch(clock)
    clock.advance(100.0)
    assert watch.step() == 0.0  # the clocks ran together
    clock.wall_offset += 0.5  # a slew/small adjustment: not a step
    assert watch.step() == 0.0
    clock.wall_offset -= 3600.5
    assert watch.step() == pytest.approx(-3601.0 + 0.5 + 0.5)
    assert watch.step() == 0.0  # seen once
    clock.wall_offset += 7200.0
    assert watch.step() == pytest.approx(7200.0)


async def test_a_finished_trash_releases_the_reclaim_its_lane_deferred(base: Path) -> None:
    # The reclaim lane looked while the trash step was still owed and deferred the reclaim by
    # backoff_initial_s (never spin). The trash finishing makes it due at once: the frozen fake
    # clock never reaches the deferral, so only the release lets the next reclaim cycle run it.
    world = make_world(base, ScriptTeardown("true"), backoff_initial_s=3600.0, backoff_jitter=0.0)
    retry = RetryService(world.service, world.clock)
    wid = "ws_" + "9" * 16
    plan_dir(world, wid, "nine")
    early = await world.service.run_cycle("reclaim")
    assert early.attempted == [], "the trash step is owed first"
    steps = {o.kind: o for o in world.service.obligations.for_workspace(wid)}
    assert steps["reclaim"].next_attempt_at >= world.clock.now + 3600.0, "deferred, not spun on"
    # Its own lane's steps only: the path lane's trash stays due (a request running the
    # teardown right now goes on to the trash).
    assert steps["trash"].next_attempt_at <= world.clock.now
    assert retry.next_delay(early) >= 3600.0
    path = await world.service.run_cycle("path")
    assert path.attempted == [wid] and world.states(wid)["trash"] == "completed", path
    late = await world.service.run_cycle("reclaim")
    assert late.attempted == [wid], "released by the finished trash: due now"
    assert world.states(wid)["reclaim"] == "completed"


async def test_a_release_keeps_a_failed_steps_own_backoff(base: Path) -> None:
    # Only steps never attempted are released: a step that failed keeps its backoff, so a
    # finished sibling step cannot turn a failing step into a hot loop.
    world = make_world(base, None, backoff_initial_s=60.0, backoff_jitter=0.0)
    wid = "ws_" + "8" * 16
    plan_dir(world, wid, "eight")
    obs = world.service.obligations
    first, *later = obs.for_workspace(wid)
    failed = obs.fail_attempt(later[0], world.clock.now, world.clock.now + 60.0, "boom")
    obs.defer_later_steps(wid, first.seq, world.clock.now + 60.0)
    released = obs.release_later_steps(wid, first.seq, world.clock.now)
    after = {o.id: o for o in obs.for_workspace(wid)}
    assert after[failed.id].next_attempt_at == world.clock.now + 60.0, "its own backoff kept"
    assert released == len(later) - 1
    assert all(after[o.id].next_attempt_at == world.clock.now for o in later[1:])
