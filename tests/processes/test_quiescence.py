"""Quiescence: holders named by kind and pid, the cwd/open-file probe, the stopper, and a
background move that stays pending until its exit is confirmed or a probe settles it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from xumd.base import faults
from xumd.base.errors import XumError
from xumd.lifecycle.hooks import busy_message

from tests.processes.test_support import (
    FakePeer,
    Harness,
    external_processes,
    running,
    stubborn_argv,
)
from tests.support.freezer import frozen
from tests.support.wait import wait_for

pytestmark = pytest.mark.anyio

external = pytest.fixture(external_processes, name="external")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _start(procs: list[subprocess.Popen[bytes]], argv: list[str], cwd: Path) -> int:
    proc = subprocess.Popen(argv, cwd=cwd, start_new_session=True)
    procs.append(proc)
    return proc.pid


async def test_busy_names_every_holder_kind_with_its_pid(
    tmp_path: Path, external: list[subprocess.Popen[bytes]]
) -> None:
    async with running(Harness(tmp_path)) as h:
        ref = h.workspace()
        other = h.workspace("other")
        term = await h.spawn(ref, ["sleep", "60"], "terminal", pty=True)
        mcp = await h.spawn(ref, ["sleep", "60"], "mcp")
        agent = await h.spawn(ref, ["sleep", "60"], "agent")
        editor_pid = _start(external, ["sleep", "60"], tmp_path)
        h.leases.acquire_external(workspace_id=ref.id, kind="editor", pid=editor_pid, label="vim")
        async with h.leases.covering(ref.id, "setup", label="setup script") as run:
            setup_pid = _start(external, ["sleep", "60"], tmp_path)
            run.on_start(setup_pid)
            holders = await h.quiet.holders(ref)
        by_kind = {x.kind: x.pid for x in holders}
        assert by_kind == {
            "terminal": term.pid,
            "mcp": mcp.pid,
            "agent": agent.pid,
            "editor": editor_pid,
            "setup": setup_pid,
        }
        # The daemon's own processes are named by id and command (archive --stop can stop
        # them); a holder it did not start has no process id.
        assert {x.kind: (x.process_id, x.command) for x in holders} == {
            "terminal": (term.id, "sleep 60"),
            "mcp": (mcp.id, "sleep 60"),
            "agent": (agent.id, "sleep 60"),
            "editor": (None, None),
            "setup": (None, None),
        }
        message = busy_message(holders)
        assert f"terminal in pid {term.pid}" in message
        assert f"MCP server in pid {mcp.pid}" in message
        assert f"vim in pid {editor_pid}" in message
        assert all(x.since for x in holders)
        # Holders of one workspace are not holders of another.
        assert await h.quiet.holders(other) == []


async def test_cwd_and_open_file_probe_finds_unleased_processes(
    tmp_path: Path, external: list[subprocess.Popen[bytes]]
) -> None:
    async with running(Harness(tmp_path)) as h:
        ref = h.workspace()
        inside = ref.path / "sub"
        inside.mkdir()
        cwd_pid = _start(external, ["sleep", "60"], inside)
        (ref.path / "notes.txt").write_text("x")
        opener = _start(
            external,
            [
                "python3",
                "-c",
                f"f = open({str(ref.path / 'notes.txt')!r}); import time; time.sleep(60)",
            ],
            tmp_path,
        )
        holders = await _until_holders(h, ref, {cwd_pid, opener})
        kinds = {x.pid: x.kind for x in holders}
        assert kinds[cwd_pid] == "process" and kinds[opener] == "process"
        assert any(x.label == "sleep" for x in holders)
        assert [x.command for x in holders if x.pid == cwd_pid] == ["sleep 60"]  # named by it
        # A leased process is reported once, through its lease, not again by the probe.
        h.leases.acquire_external(workspace_id=ref.id, kind="terminal", pid=cwd_pid, label="term")
        holders = await h.quiet.holders(ref)
        assert [x.kind for x in holders if x.pid == cwd_pid] == ["terminal"]


async def _until_holders(h: Harness, ref: object, pids: set[int]) -> list[object]:
    import anyio

    for _ in range(200):
        holders = await h.quiet.holders(ref)  # type: ignore[arg-type]
        if pids <= {x.pid for x in holders}:
            return holders  # type: ignore[return-value]
        await anyio.sleep(0.02)
    raise AssertionError(f"probe never found {pids}")


async def test_archive_stop_stops_own_processes_but_external_holders_remain(
    tmp_path: Path, external: list[subprocess.Popen[bytes]]
) -> None:
    async with running(Harness(tmp_path, grace_s=0.3)) as h:
        ref = h.workspace()
        agent = await h.spawn(ref, stubborn_argv(1), "agent")
        editor_pid = _start(external, ["sleep", "60"], tmp_path)
        h.leases.acquire_external(workspace_id=ref.id, kind="editor", pid=editor_pid, label="code")
        stopped, left = await h.quiet.stop(ref, 8.0)
        assert left == []
        assert len(stopped) == 1 and stopped[0].startswith("proc_")
        assert agent.exit is not None
        holders = await h.quiet.holders(ref)
        assert [(x.kind, x.pid) for x in holders] == [("editor", editor_pid)]


async def test_archive_stop_names_a_process_whose_stop_is_unconfirmed_as_pending_stop(
    tmp_path: Path,
) -> None:
    """A bounded stop that cannot see its process exit in time (frozen: SIGKILL waits for the
    thaw) reports it as `pending_stop`, never under its own kind as if the stop had not been
    asked, and stopped nothing; once it is gone, nothing holds the checkout."""
    async with running(Harness(tmp_path, grace_s=0.2)) as h:
        ref = h.workspace()
        agent = await h.spawn(ref, ["sleep", "60"], "agent")
        assert agent.pid is not None
        with frozen(agent.pid):
            stopped, left = await h.quiet.stop(ref, 1.0)
            assert stopped == []
            assert [(x.kind, x.pid) for x in left] == [("pending_stop", agent.pid)]
            assert [(x.process_id, x.command) for x in left] == [(agent.id, "sleep 60")]
            holders = await h.quiet.holders(ref)
            assert [(x.kind, x.pid) for x in holders] == [("pending_stop", agent.pid)]
        await h.sup.wait(agent, 10)  # thawed: the SIGKILL takes effect
        assert agent.exit is not None
        assert await h.quiet.holders(ref) == []


@pytest.mark.parametrize("confirmation", ["arrives", "never_arrives"])
async def test_refused_background_move_stays_pending_until_settled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, confirmation: str
) -> None:
    if confirmation == "never_arrives":
        monkeypatch.setattr(faults, "_armed", "process.exit.unconfirmed")
    # A long grace: the stubborn command outlives the stop until the test ends it itself.
    async with running(Harness(tmp_path, grace_s=60.0)) as h:
        ref = h.workspace()
        other = h.workspace("other")
        peer = FakePeer(3)
        cmd = await h.spawn(ref, stubborn_argv(0), foreground_peer=peer.id)
        await wait_for(lambda: b"pid" in cmd.ring.head)
        h.sup.watch_peer(peer)
        peer.close()  # the caller's session goes: its foreground command is being stopped
        await wait_for(lambda: cmd.state == "stopping")
        with pytest.raises(XumError) as refused:
            await h.sup.background(cmd)
        assert refused.value.data["state"] == "pending_stop"
        holders = await h.quiet.holders(ref)
        assert [(x.kind, x.pid) for x in holders] == [("pending_stop", cmd.pid)]
        # It blocks only that workspace: others stay free, and new work can start.
        assert await h.quiet.holders(other) == []
        extra = await h.sup.spawn(workspace_id=other.id, kind="exec", argv=["true"])
        await h.sup.wait(extra, 10)
        # The command finally dies (SIGKILL from outside the daemon).
        assert cmd.pgid is not None
        os.killpg(cmd.pgid, signal.SIGKILL)
        await h.sup.wait(cmd, 10)
        assert cmd.exit is not None
        expected = "exit" if confirmation == "arrives" else "probe"
        assert cmd.exit["settled_by"] == expected
        if confirmation == "arrives":
            assert cmd.exit["signal"] == "SIGKILL"
        assert await h.quiet.holders(ref) == []


async def test_admission_closed_refuses_the_move_and_stops_the_command(tmp_path: Path) -> None:
    async with running(Harness(tmp_path, grace_s=0.2)) as h:
        ref = h.workspace()
        peer = FakePeer(4)
        cmd = await h.spawn(ref, ["sleep", "60"], foreground_peer=peer.id)
        h.admission_closed.add(ref.id)
        with pytest.raises(XumError) as refused:
            await h.sup.background(cmd)
        assert refused.value.kind == "busy"
        assert refused.value.data["process_id"] == cmd.id
        await h.sup.wait(cmd, 10)
        assert cmd.exit is not None and cmd.exit["signal"] == "SIGTERM"
