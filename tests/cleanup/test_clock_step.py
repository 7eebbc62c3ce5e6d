"""A wall-clock step while the daemon runs, against pending cleanup retries: stored due times are
wall-clock times, the lanes wait on the monotonic clock, and a step re-anchors the stored times
when the scheduler wakes. A retry keeps the wait it had left whichever way the clock jumps and
whenever its due time was written, before the step or between the step and that wake-up.

A real daemon whose wall clock alone is stepped (libfaketime in the daemon process, its
monotonic and boot clocks left real; the clock is the one thing a test may fake), real git, a
real teardown script that fails until the test lets it pass. The window between a step and the
scheduler's look is held open with the retry service's start hold, never a sleep."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xumd.cleanup.retry import START_HOLD

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import make_repo
from tests.support.holds import hold_env, release, wait_held
from tests.support.lifecycle_helpers import add_project, commit_scripts, create, failing_teardown
from tests.support.wait import until

DAY = 86400
LIBFAKETIME = next(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"), None)
# A retry comes a second after a failure, never more than two: anything later is the step's.
FAST = "[cleanup]\nbackoff_initial_s = 1.0\nbackoff_max_s = 2.0\nbackoff_jitter = 0.0\n"


class Stepped:
    def __init__(
        self, daemon: DaemonProcess, project: dict[str, Any], spec: Path, holds: Path
    ) -> None:
        self.daemon = daemon
        self.project = project
        self.spec = spec
        self.holds = holds

    def step(self, seconds: int) -> None:
        """The daemon's wall clock jumps by `seconds` from now on (read on every call)."""
        self.spec.write_text(f"{seconds:+d}\n")

    def archive_pending(self, name: str) -> dict[str, Any]:
        ws: dict[str, Any] = create(self.daemon, self.project["id"], name)["workspace"]
        cleanup = self.daemon.call("workspace.archive", {"workspace_id": ws["id"]})["cleanup"]
        assert cleanup["status"] == "pending" and "still in use" in cleanup["last_error"]
        return ws

    def wait_completed(self, ws: dict[str, Any]) -> None:
        def completed() -> bool:
            got = self.daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
            return bool((got["last_cleanup"] or {}).get("status") == "completed")

        # The retry is due a second after the failure; a retry moved by the step would be a day
        # away (an hour, with the hourly clamp of future times).
        until(completed, timeout=30.0, message="the retry service to complete the cleanup")
        assert not Path(ws["path"]).exists()


@pytest.fixture
def stepped(tmp_short: Path, ctl: Path) -> Iterator[Stepped]:
    """A daemon under libfaketime (no step yet) with a trusted project whose teardown fails
    until `ctl/ok` exists; its retry service held before its first look until `release`."""
    if LIBFAKETIME is None:
        pytest.skip("libfaketime not installed (/usr/lib/*/faketime/; Debian package faketime)")
    spec = tmp_short / "faketime"
    spec.write_text("+0\n")
    holds = tmp_short / "holds"
    env = {
        **hold_env(START_HOLD.name, holds),
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME_TIMESTAMP_FILE": str(spec),
        "FAKETIME_NO_CACHE": "1",  # read the file on every call: a step lands at once
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # monotonic and boot clocks stay real
    }
    repo = make_repo(tmp_short / "repo", {"README.md": "hi\n", ".xum/config.toml": ""})
    commit_scripts(repo, teardown=failing_teardown(ctl))
    write_config(tmp_short / "root", FAST)
    daemon = DaemonProcess(tmp_short / "root", env=env).start()
    try:
        project = add_project(daemon, repo)
        daemon.call("project.trust", {"project_id": project["id"]})
        wait_held(START_HOLD.name, holds)  # the cleanup feature is built; its lanes wait
        yield Stepped(daemon, project, spec, holds)
    finally:
        daemon.close()


def test_a_retry_due_before_the_wall_clock_stepped_back_a_day_runs_when_it_was_due(
    stepped: Stepped, ctl: Path
) -> None:
    release(START_HOLD.name, stepped.holds)  # the service runs throughout
    ws = stepped.archive_pending("back")  # its retry is stored as due a second from now
    stepped.step(-DAY)  # the stored due time is now a day ahead of the daemon's clock

    def teardown_due() -> float:
        listed = stepped.daemon.call("cleanup.list", {"workspace_id": ws["id"]})["obligations"]
        return float(next(o for o in listed if o["kind"] == "teardown")["next_attempt_at"])

    # What the daemon shows is re-anchored too, once the scheduler has woken: a retry due
    # within seconds on the daemon's clock (now a day behind this one), not a day from now.
    until(
        lambda: teardown_due() < time.time() - DAY + 60,
        message="the stored due time to be re-anchored by the step",
    )
    assert '"clock.stepped"' in stepped.daemon.log_text()
    (ctl / "ok").touch()
    stepped.wait_completed(ws)


def test_a_due_time_written_after_a_step_ahead_is_not_moved_by_it_a_second_time(
    stepped: Stepped, ctl: Path
) -> None:
    # The scheduler last looked before the step (its lanes are held there); a request plans
    # and fails the cleanup after it, on the stepped clock. When the lanes wake, the step must
    # not be applied to that due time too: it would put the retry a day late.
    stepped.step(+DAY)
    ws = stepped.archive_pending("ahead")
    (ctl / "ok").touch()
    release(START_HOLD.name, stepped.holds)
    stepped.wait_completed(ws)

    def states() -> dict[str, str]:
        listed = stepped.daemon.call("cleanup.list", {"workspace_id": ws["id"]})["obligations"]
        return {o["kind"]: o["state"] for o in listed}

    # The reclaim, planned after the step too, is not moved by it either.
    until(lambda: set(states().values()) == {"completed"}, timeout=30.0, message="the reclaim")
