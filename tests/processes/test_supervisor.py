"""The supervisor on real processes, in-process (no daemon, no lifecycle needed)."""

from __future__ import annotations

import base64
import os
import signal
import time
from pathlib import Path

import anyio
import pytest
from xumd.base.errors import XumError
from xumd.processes.supervisor import parse_signal

from tests.processes.test_support import (
    PY,
    FakePeer,
    Harness,
    pids_in,
    running,
    stubborn_argv,
)
from tests.support.procs import alive, changed_signals, identify_all
from tests.support.wait import wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_exec_output_exit_code_and_lease_lifetime(tmp_path: Path) -> None:
    async with running(Harness(tmp_path)) as h:
        ref = h.workspace()
        m = await h.spawn(
            ref,
            [PY, "-c", "import os,sys; print(os.getcwd()); sys.exit(3)"],
            "exec",
        )
        # Written before the program ran, with the pid and start time of the child.
        lease = h.leases.for_process(m.id)
        assert lease is not None and lease.pid == m.pid and lease.start_time
        await h.sup.wait(m, 10)
        assert m.exit is not None
        assert m.exit["code"] == 3 and m.exit["settled_by"] == "exit"
        out = await h.sup.output(m, 0, 0, 65536, "utf-8")
        assert out["data"].strip() == str(ref.path)
        assert out["exited"] is True
        assert h.leases.for_process(m.id) is None
        types = [e.type for e in h.seen]
        assert "process.started" in types and "process.exited" in types


async def test_bad_input_leaves_nothing_behind(tmp_path: Path) -> None:
    async with running(Harness(tmp_path)) as h:
        ref = h.workspace()
        with pytest.raises(XumError) as missing:
            await h.spawn(ref, ["no-such-program-xum"])
        assert missing.value.kind == "invalid_params"
        assert "no-such-program-xum" in missing.value.message
        with pytest.raises(XumError) as empty:
            await h.spawn(ref, [])
        assert empty.value.kind == "invalid_params"
        with pytest.raises(XumError) as unknown_ws:
            await h.sup.spawn(workspace_id="ws_" + "0" * 16, kind="exec", argv=["true"])
        assert unknown_ws.value.kind == "not_found"
        assert h.lease_rows() == []
        assert h.sup.procs == {}
        with pytest.raises(XumError) as bad_signal:
            parse_signal("SIGNOPE")
        assert bad_signal.value.kind == "invalid_params"
        assert parse_signal("term") == signal.SIGTERM
        with pytest.raises(XumError) as bad_id:
            h.sup.get("lease_" + "0" * 16)
        assert bad_id.value.kind == "invalid_scope"


async def test_pty_terminal_size_resize_and_input(tmp_path: Path) -> None:
    async with running(Harness(tmp_path)) as h:
        ref = h.workspace()
        m = await h.spawn(
            ref,
            ["sh", "-c", "stty size; tty >/dev/null && echo tty-ok; read x; stty size"],
            "terminal",
            pty=True,
            cols=100,
            rows=30,
        )
        await wait_for(lambda: b"tty-ok" in m.ring.tail + m.ring.head)
        h.sup.resize(m, 50, 20)
        await h.sup.write(m, b"go\n", False)
        await h.sup.wait(m, 10)
        text = (await h.sup.output(m, 0, 0, 65536, "base64"))["data"]
        decoded = base64.b64decode(text).decode()
        assert "30 100" in decoded
        assert "20 50" in decoded


async def test_output_ring_keeps_head_and_tail_and_counts_drops(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.sup.head_bytes, h.sup.tail_bytes = 100, 100
    async with running(h):
        ref = h.workspace()
        m = await h.spawn(
            ref,
            [PY, "-c", "import sys; sys.stdout.write('H' * 100 + 'x' * 5000 + 'T' * 100)"],
            "exec",
        )
        await h.sup.wait(m, 10)
        first = await h.sup.output(m, 0, 0, 65536, "utf-8")
        assert first["data"] == "H" * 100
        rest = await h.sup.output(m, first["next"], 0, 65536, "utf-8")
        assert rest["data"] == "T" * 100
        assert rest["dropped"] == 5000 and rest["dropped_total"] == 5000
        assert rest["next"] == 5200 and rest["exited"]


async def test_stop_kills_a_stubborn_tree_within_the_deadline(tmp_path: Path) -> None:
    async with running(Harness(tmp_path, grace_s=0.5)) as h:
        ref = h.workspace()
        m = await h.spawn(ref, stubborn_argv(2), "agent")
        text = await wait_for(
            lambda: len(pids_in(m.ring.head.decode())) == 3 and m.ring.head.decode()
        )
        procs = identify_all(pids_in(text))
        started = time.monotonic()
        await h.sup.stop(m, 0.5)
        elapsed = time.monotonic() - started
        assert elapsed < 0.5 + 4.0
        assert m.exit is not None and m.exit["signal"] == "SIGKILL"
        assert not any(alive(p) for p in procs), "a member of the tree survived"
        assert h.leases.for_process(m.id) is None


async def test_signal_and_wait_timeout(tmp_path: Path) -> None:
    async with running(Harness(tmp_path)) as h:
        ref = h.workspace()
        m = await h.spawn(ref, ["sleep", "30"], "mcp")
        with pytest.raises(XumError) as timeout:
            await h.sup.wait(m, 0.1)
        assert timeout.value.kind == "timeout"
        h.sup.signal(m, signal.SIGINT)
        await h.sup.wait(m, 10)
        assert m.exit is not None and m.exit["signal"] == "SIGINT"
        with pytest.raises(XumError) as gone:
            h.sup.signal(m, signal.SIGTERM)
        assert gone.value.kind == "invalid_state"


async def test_foreground_exec_is_stopped_when_its_caller_goes(tmp_path: Path) -> None:
    async with running(Harness(tmp_path, grace_s=0.3)) as h:
        ref = h.workspace()
        peer = FakePeer(7)
        fg = await h.spawn(ref, ["sleep", "30"], foreground_peer=peer.id)
        bg = await h.spawn(ref, ["sleep", "30"], foreground_peer=peer.id)
        h.sup.watch_peer(peer)
        assert (await h.sup.background(bg)).foreground_peer is None
        peer.close()
        await h.sup.wait(fg, 10)
        assert bg.state == "running"
        await h.sup.stop(bg, 0.2)


async def test_spawn_gate_failure_runs_nothing(tmp_path: Path) -> None:
    """A child whose gate closes without a go never runs its program."""
    from xumd.processes.spawn import start_child

    marker = tmp_path / "ran"
    child = start_child(
        ["sh", "-c", f"touch {marker}"], cwd=tmp_path, env=dict(os.environ), pty=False
    )
    child.close_gate()
    assert child.popen.wait(10) == 125  # the shim's own exit: the program never ran
    child.close_all()
    assert not marker.exists()
    await anyio.sleep(0)


async def test_exited_processes_are_pruned_to_a_bound(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.sup.keep_exited = 2
    async with running(h):
        ref = h.workspace()
        done = []
        for _ in range(4):
            m = await h.spawn(ref, ["true"])
            await h.sup.wait(m, 10)
            done.append(m.id)
        assert sorted(h.sup.procs) == sorted(done[-2:])


async def test_release_all_is_bounded_and_reports_what_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(Harness(tmp_path, grace_s=0.2)) as h:
        ref = h.workspace()
        quick = await h.spawn(ref, stubborn_argv(1))
        await wait_for(lambda: len(pids_in(quick.ring.head.decode())) == 2)
        stopped, left = await h.sup.release_all(ref.id, 6.0)
        assert stopped == [quick.id] and left == []

        stuck = await h.spawn(ref, ["sleep", "60"], "agent")

        async def kill_never_lands(pid: int, pgid: int | None, grace_s: float) -> bool:
            await anyio.sleep(3600)  # a fault: the process never dies (e.g. stuck in D state)
            return False

        monkeypatch.setattr("xumd.processes.stopping.kill_tree", kill_never_lands)
        started = time.monotonic()
        stopped, left = await h.sup.release_all(ref.id, 0.5)
        assert time.monotonic() - started < 3.0  # 0.5s deadline, slack for a loaded machine
        assert stopped == [] and [m.id for m in left] == [stuck.id]
        assert stuck.state == "pending_stop"  # reported, and it keeps blocking cleanup
        holders = await h.quiet.holders(ref)
        assert [(x.kind, x.pid) for x in holders] == [("pending_stop", stuck.pid)]
        monkeypatch.undo()
        await h.sup.stop(stuck, 0.2)


async def test_a_program_starts_with_every_signal_at_its_default(tmp_path: Path) -> None:
    """The start shim is Python, which ignores SIGPIPE and SIGXFSZ and catches SIGINT; an ignored
    signal survives exec. The program must get none of that: nothing ignored, nothing blocked
    (a pipeline inside it dies of a closed pipe, a SIGINT right after the start is not lost)."""
    async with running(Harness(tmp_path)) as h:
        ref = h.workspace()
        m = await h.spawn(ref, ["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"])
        await h.sup.wait(m, 10)
        out = (await h.sup.output(m, 0, 0, 65536, "utf-8"))["data"]
        assert changed_signals(out) == {"SigIgn": set(), "SigBlk": set()}
