"""Durable use leases and the liveness rule, on real processes (no daemon needed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from xumd.base.events import EventBus
from xumd.processes.leases import LeaseStore
from xumd.store import Store
from xumd.system.procstat import start_time

from tests.processes.test_support import Harness
from tests.support.wait import until


@pytest.fixture
def leases(tmp_path: Path) -> Iterator[LeaseStore]:
    store = Store(tmp_path / "state.db")
    store.migrate()
    yield LeaseStore(store, EventBus())
    store.close()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


WS = "ws_" + "a" * 16


def test_external_lease_is_live_then_reclaimed_when_its_holder_dies(
    leases: LeaseStore, sleeper: subprocess.Popen[bytes]
) -> None:
    lease, created = leases.acquire_external(
        workspace_id=WS, kind="editor", pid=sleeper.pid, label="vim"
    )
    assert created and lease.pid == sleeper.pid and lease.pgid == sleeper.pid
    again, created_again = leases.acquire_external(
        workspace_id=WS, kind="editor", pid=sleeper.pid, label="vim"
    )
    assert again.id == lease.id and not created_again  # one per (holder, workspace, kind)
    live, reclaimed = leases.reclaim_dead(WS)
    assert [x.id for x in live] == [lease.id] and reclaimed == []
    sleeper.kill()
    sleeper.wait(10)
    live, reclaimed = leases.reclaim_dead(WS)
    assert live == [] and [x.id for x in reclaimed] == [lease.id]
    assert leases.get(lease.id) is None


def test_pid_reuse_is_not_liveness(leases: LeaseStore, sleeper: subprocess.Popen[bytes]) -> None:
    """A lease whose pid now belongs to a process with another start time is dead, even though
    a process with that pid (and a group with that id) exists."""
    real = start_time(sleeper.pid)
    assert real is not None
    lease = leases.write_intent(
        workspace_id=WS,
        kind="terminal",
        holder="pid:reused",
        label="old terminal",
        pid=sleeper.pid,
        pgid=sleeper.pid,
        start=real - 1000.0,
    )
    assert sleeper.poll() is None  # that very process still runs (a child not reaped yet)
    assert not leases.is_live(lease)
    _live, reclaimed = leases.reclaim_dead(WS)
    assert [x.id for x in reclaimed] == [lease.id]


def test_group_keeps_a_lease_alive_after_its_leader_exits(leases: LeaseStore) -> None:
    leader = subprocess.Popen(
        [sys.executable, "-c", "import subprocess; subprocess.Popen(['sleep', '60'])"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )
    leader.wait(10)
    lease = leases.write_intent(
        workspace_id=WS,
        kind="agent",
        holder="proc_group",
        label="agent",
        pid=leader.pid,
        pgid=leader.pid,
        start=start_time(leader.pid) or 0.0,
    )
    try:
        assert leases.is_live(lease), "a member of the recorded group still runs"
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
    until(lambda: not leases.is_live(lease), message="group gone")


def test_a_pid_that_is_not_a_process_is_refused(leases: LeaseStore) -> None:
    with pytest.raises(LookupError, match="not a running process"):
        leases.acquire_external(workspace_id=WS, kind="editor", pid=2**22 + 12345, label="x")
    assert leases.rows() == []


def test_lease_without_pid_lives_only_as_long_as_its_daemon(leases: LeaseStore) -> None:
    mine = leases.write_intent(workspace_id=WS, kind="setup", holder="run:1", label="setup")
    assert leases.is_live(mine)
    gone = subprocess.Popen(["true"])
    gone.wait(10)
    leases.store.execute(
        "INSERT INTO leases (id, workspace_id, kind, holder, owner_pid, owner_start, label, "
        "created_at) VALUES ('lease_dead', ?, 'setup', 'run:2', ?, 1.0, 'setup', 0)",
        (WS, gone.pid),
    )
    _live, reclaimed = leases.reclaim_dead(WS)
    assert [x.id for x in reclaimed] == ["lease_dead"]


async def test_script_lease_covers_a_run_command(tmp_path: Path) -> None:
    from xumd.system.procutil import run_command

    h = Harness(tmp_path)
    seen: list[int | None] = []

    async with h.leases.covering(WS, "setup", label="setup script") as lease:
        assert h.leases.get(lease.lease.id) is not None

        def on_start(pid: int) -> None:
            lease.on_start(pid)
            row = h.leases.get(lease.lease.id)
            seen.append(row.pid if row else None)

        result = await run_command(["true"], timeout_s=10, on_start=on_start)
        assert result.ok
    assert seen == [result.pid]
    assert h.leases.get(lease.lease.id) is None
    h.store.close()


pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
