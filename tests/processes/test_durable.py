"""Durable I/O of keepable processes, in-process on real processes and a real filesystem: the
bounded output file (head kept, holes punched, drop counted, offsets stable when reopened), the
stdin FIFO, which kinds are kept, and removal of the files with the record."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from xumd.base.errors import XumError
from xumd.processes.output_log import OutputLog

from tests.processes.test_support import PY, Harness, running
from tests.support.wait import wait_for

pytestmark = pytest.mark.anyio

CHATTY = (
    "import os, sys\n"
    "os.write(1, b'H' * 1024)\n"
    "for _ in range(2000): os.write(1, b'x' * 2048)\n"
    "sys.stderr.write('T' * 1000); sys.stderr.flush()\n"
)
ECHO = "import sys\nfor line in sys.stdin: print('in', line.strip(), flush=True)\n"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def keeping(tmp_path: Path, **extra: object) -> Harness:
    return Harness(tmp_path, io_dir=tmp_path / "processes", keep_processes=True, **extra)


async def test_chatty_output_file_is_bounded_head_kept_drop_counted(tmp_path: Path) -> None:
    h = keeping(tmp_path)
    h.sup.head_bytes, h.sup.tail_bytes = 1024, 4096
    async with running(h):
        ref = h.workspace()
        m = await h.spawn(ref, [PY, "-c", CHATTY], "agent")
        assert m.io is not None and m.on_daemon_stop == "keep"
        directory = m.io.directory
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert stat.S_IMODE(m.io.output.stat().st_mode) == 0o600
        assert stat.S_ISFIFO(m.io.stdin.stat().st_mode)
        await h.sup.wait(m, 20)
        written = 1024 + 2000 * 2048 + 1000
        on_disk = m.io.output.stat().st_blocks * 512
        block = m.io.output.stat().st_blksize
        # head (one block) + at most twice the tail + a block + what one poll let through
        assert on_disk < 4 * block + 2 * 4096 + 256 * 1024, on_disk
        assert m.io.output.stat().st_size == written  # the offsets are the stream's
        head = await h.sup.output(m, 0, 0, 1 << 20, "utf-8")
        assert head["data"].startswith("H" * 1024) and head["dropped"] == 0
        assert head["source"] == "file"
        rest = await h.sup.output(m, head["next"], 0, 1 << 20, "utf-8")
        assert rest["dropped"] > written - 1024 - 3 * 4096 - block
        assert rest["dropped_total"] == rest["dropped"]
        assert rest["data"].endswith("T" * 1000) and rest["next"] == written
        assert rest["exited"] and rest["exit"]["code"] == 0

        # The record is pruned: its files go with it.
        h.sup.keep_exited = 0
        other = await h.spawn(ref, ["true"])
        await h.sup.wait(other, 10)
        assert m.id not in h.sup.procs
        assert not directory.exists()


async def test_log_reopened_keeps_offsets_and_the_dropped_range(tmp_path: Path) -> None:
    """A restarted daemon reopens the same file: the same bytes at the same offsets, and the
    punched range is known from output.meta (its zeros are never served)."""
    path, meta = tmp_path / "output", tmp_path / "output.meta"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        first = OutputLog(path, meta, head_limit=10, tail_limit=4096)
        os.write(fd, b"a" * 4096 + b"b" * 20000 + b"c" * 100)
        assert first.refresh()
        assert first.dropped > 0 and first.kept_from % first.block == 0
        before = [first.read(since, 1 << 20) for since in (0, first.hole_start, 5000)]
        first.close()
        os.write(fd, b"d" * 10)
        again = OutputLog(path, meta, head_limit=10, tail_limit=4096)
        assert (again.hole_start, again.kept_from) == (first.hole_start, first.kept_from)
        after = [again.read(since, 1 << 20) for since in (0, first.hole_start, 5000)]
        for old, new in zip(before, after, strict=True):
            assert (new.start, new.dropped) == (old.start, old.dropped)
            assert new.data == old.data + (b"d" * 10 if old.start >= again.kept_from else b"")
        assert b"\0" not in b"".join(c.data for c in after)
        assert after[0].data == b"a" * first.hole_start  # the head, then the gap is reported
        again.close()
    finally:
        os.close(fd)


async def test_durable_stdin_survives_writers_and_refuses_eof(tmp_path: Path) -> None:
    async with running(keeping(tmp_path)) as h:
        ref = h.workspace()
        m = await h.spawn(ref, [PY, "-c", ECHO], "mcp")
        assert m.io is not None
        await h.sup.write(m, b"one\n", False)
        # The daemon's write end goes (as at a daemon stop): the child sees no EOF.
        m.io.close_writer()
        await h.sup.write(m, b"two\n", False)
        await wait_for(lambda: b"in two" in h.sup.procs[m.id].ring.read(0, 4096).data)
        assert m.live_state
        with pytest.raises(XumError) as refused:
            await h.sup.write(m, b"", True)
        assert refused.value.kind == "invalid_state" and "cannot be closed" in str(refused.value)
        await h.sup.stop(m, 0.2)
        assert m.exit is not None and m.exit["stop_reason"] == "request"


async def test_only_agents_and_mcp_servers_without_a_pty_are_kept(tmp_path: Path) -> None:
    async with running(keeping(tmp_path)) as h:
        ref = h.workspace()
        agent = await h.spawn(ref, ["sleep", "30"], "agent")
        pty_agent = await h.spawn(ref, ["sleep", "30"], "agent", pty=True)
        term = await h.spawn(ref, ["sleep", "30"], "terminal", pty=True)
        cmd = await h.spawn(ref, ["sleep", "30"])
        assert [p.on_daemon_stop for p in (agent, pty_agent, term, cmd)] == [
            "keep",
            "stop",
            "stop",
            "stop",
        ]
        assert [p.io is not None for p in (agent, pty_agent, term, cmd)] == [
            True,
            False,
            False,
            False,
        ]
        left = await h.sup.shutdown(5.0)
        assert left == [] and agent.live_state
        assert all(p.exit and p.exit["stop_reason"] == "shutdown" for p in (pty_agent, term, cmd))
        kept = [e.data["process"]["id"] for e in h.seen if e.type == "process.kept"]
        assert kept == [agent.id]
        await h.sup.stop(agent, 0.2)
        assert not agent.live_state


async def test_without_keep_processes_nothing_is_durable(tmp_path: Path) -> None:
    h = Harness(tmp_path, io_dir=tmp_path / "processes", keep_processes=False)
    async with running(h):
        agent = await h.spawn(h.workspace(), ["sleep", "30"], "agent")
        assert agent.io is None and agent.on_daemon_stop == "stop"
        assert not (tmp_path / "processes").exists()
