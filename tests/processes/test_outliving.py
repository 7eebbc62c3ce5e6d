"""keep_processes through a real daemon: a chatty agent survives `daemon.shutdown` and a restart
(adopted, same output offsets, stdin still works, no EPIPE), is stopped as a whole tree after the
restart; a terminal is stopped at shutdown and says so; without keep_processes, nothing stays."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xum_client.errors import ConnectionLost

from tests.processes.test_support import PY, insert_workspace
from tests.support.daemon import DaemonProcess, write_config
from tests.support.procs import ProcId, alive, identify
from tests.support.wait import until

CONFIG = (
    "stop_grace_s = 0.5\ndrain_deadline_s = 8\n"
    "[processes]\nprobe_interval_s = 0.1\noutput_poll_s = 0.05\n"
)
XUM = [PY, "-c", "from xum_client.cli import main; main()"]

# A tick every 50 ms, an echo of stdin, and a child that ignores SIGTERM. No SIGPIPE handler:
# Python ignores SIGPIPE, so a write to a pipe without a reader raises and ends the agent.
AGENT = r"""
import os, signal, subprocess, sys, threading, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
os.write(1, b"child %d\n" % child.pid)
def echo():
    for line in sys.stdin:
        os.write(1, b"in " + line.strip().encode() + b"\n")
threading.Thread(target=echo, daemon=True).start()
n = 0
while True:
    os.write(1, b"tick %d\n" % n)
    n += 1
    time.sleep(0.05)
"""

WAIT_FOR_STOP_FILE = "echo hello; while [ ! -e stop ]; do sleep 0.05; done; echo bye"


@pytest.fixture
def root(tmp_short: Path) -> Path:
    return tmp_short / "root"


@pytest.fixture
def pids() -> Iterator[list[ProcId]]:
    """Processes a test expects to end: SIGKILLed afterwards if they did not."""
    found: list[ProcId] = []
    yield found
    for proc in found:
        if alive(proc):
            os.kill(proc.pid, signal.SIGKILL)


def output(daemon: DaemonProcess, process_id: str, since: int = 0, **extra: Any) -> dict[str, Any]:
    params = {"process_id": process_id, "since": since, "max_bytes": 1 << 20, **extra}
    return daemon.call("process.output", params)


def text_with(daemon: DaemonProcess, process_id: str, needle: str) -> str:
    """The whole output once it contains `needle` (else empty, for `until`)."""
    text: str = output(daemon, process_id)["data"]
    return text if needle in text else ""


def ticks(text: str) -> list[int]:
    return [int(line.split()[1]) for line in text.splitlines() if line.startswith("tick ")]


def spawn(daemon: DaemonProcess, ws: str, kind: str, argv: list[str], **extra: Any) -> Any:
    params = {"workspace_id": ws, "kind": kind, "argv": argv, **extra}
    return daemon.call("process.spawn", params)["process"]


def shutdown_watching_events(daemon: DaemonProcess) -> list[dict[str, Any]]:
    """`daemon.shutdown`, and the process events published until the connection closed."""
    seen: list[dict[str, Any]] = []
    with daemon.client(timeout=30) as sub:
        sub.call("events.subscribe", {"types": ["process."]})
        daemon.call("daemon.shutdown")
        try:
            while True:
                seen.append(sub.next_notification()["params"])
        except ConnectionLost:
            pass
    assert daemon.wait(30) == 0
    return seen


def test_kept_agent_survives_a_restart_with_its_output_and_input(
    root: Path, tmp_short: Path, pids: list[ProcId]
) -> None:
    write_config(root, CONFIG + "keep_processes = true\n")
    ws = insert_workspace(root, tmp_short / "checkouts" / "w")
    daemon = DaemonProcess(root).start()
    try:
        agent = spawn(daemon, ws, "agent", [PY, "-c", AGENT])
        term = spawn(daemon, ws, "terminal", ["sleep", "60"], pty=True)
        assert (agent["on_daemon_stop"], term["on_daemon_stop"]) == ("keep", "stop")
        pids += [identify(agent["pid"]), identify(term["pid"])]
        text = until(lambda: text_with(daemon, agent["id"], "tick 2\n"))
        pids.append(identify(int(text.split()[1])))  # the agent's child
        daemon.call("process.write", {"process_id": agent["id"], "data": "before\n"})
        until(lambda: "in before" in output(daemon, agent["id"])["data"])
        io_dir = root / "processes" / agent["id"]
        assert stat.S_IMODE(io_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE((io_dir / "output").stat().st_mode) == 0o600

        before = output(daemon, agent["id"])
        events = shutdown_watching_events(daemon)
        kept = [e["data"]["process"] for e in events if e["type"] == "process.kept"]
        assert [p["id"] for p in kept] == [agent["id"]]
        term_exit = [
            e["data"]["process"]["exit"]
            for e in events
            if e["type"] == "process.exited" and e["data"]["process"]["id"] == term["id"]
        ]
        assert term_exit and term_exit[0]["stop_reason"] == "shutdown"
        assert alive(pids[0]) and alive(pids[2]) and not alive(pids[1])
        # No daemon now: the agent goes on writing (to its file, not a dead pipe).
        size = (io_dir / "output").stat().st_size
        until(lambda: (io_dir / "output").stat().st_size > size + 40)
        daemon.start()
        # The offsets are the same after the restart: reading on from `next` continues the stream.
        after = output(daemon, agent["id"], before["next"])
        assert after["start"] == before["next"] and after["dropped"] == 0
        assert after["source"] == "file" and after["data"].startswith("tick ")
        assert ticks(after["data"])[0] == ticks(before["data"])[-1] + 1

        listed = daemon.call("process.list", {"workspace_id": ws})["processes"]
        assert [(p["id"], p["adopted"], p["state"]) for p in listed] == [
            (agent["id"], True, "running")
        ]
        assert listed[0]["on_daemon_stop"] == "keep"
        # Long-poll on the adopted agent: new output arrives well before the wait ends.
        started = time.monotonic()
        more = output(daemon, agent["id"], after["next"], wait_s=10)
        assert more["data"] and time.monotonic() - started < 5
        daemon.call("process.write", {"process_id": agent["id"], "data": "after\n"})
        whole = until(lambda: text_with(daemon, agent["id"], "in after"))
        seen = ticks(whole)
        assert seen == list(range(len(seen))), "a tick was lost or the agent restarted"
        assert "in before" in whole and alive(pids[0])

        ps = subprocess.run(
            [*XUM, "ps"],
            capture_output=True,
            text=True,
            env={**os.environ, "XUM_ROOT": str(root)},
            timeout=60,
        )
        line = next(x for x in ps.stdout.splitlines() if agent["id"] in x)
        assert "(adopted)" in line and " keep " in line

        started = time.monotonic()
        stopped = daemon.call("process.stop", {"process_id": agent["id"], "grace_s": 0.3})
        assert time.monotonic() - started < 8
        assert stopped["process"]["state"] == "exited"
        assert stopped["process"]["exit"]["stop_reason"] == "request"
        assert not alive(pids[0]) and not alive(pids[2]), "the tree survived the stop"
        done = output(daemon, agent["id"], more["next"], wait_s=5)
        assert done["exited"] or output(daemon, agent["id"], done["next"], wait_s=5)["exited"]
        assert daemon.call("lease.list")["leases"] == []
    finally:
        daemon.close()


def test_without_keep_processes_shutdown_stops_everything_and_leaves_nothing(
    root: Path, tmp_short: Path, pids: list[ProcId]
) -> None:
    write_config(root, CONFIG)
    ws = insert_workspace(root, tmp_short / "checkouts" / "w")
    daemon = DaemonProcess(root).start()
    try:
        agent = spawn(daemon, ws, "agent", [PY, "-c", AGENT])
        mcp = spawn(daemon, ws, "mcp", ["sleep", "60"])
        term = spawn(daemon, ws, "terminal", ["sleep", "60"], pty=True)
        assert {p["on_daemon_stop"] for p in (agent, mcp, term)} == {"stop"}
        pids += [identify(p["pid"]) for p in (agent, mcp, term)]
        text = until(lambda: output(daemon, agent["id"])["data"])
        pids.append(identify(int(text.split()[1])))
        events = shutdown_watching_events(daemon)
        assert not [e for e in events if e["type"] == "process.kept"]
        assert not any(alive(proc) for proc in pids), "a process survived the shutdown"
        processes = root / "processes"
        assert not processes.exists() or list(processes.iterdir()) == []
        daemon.start()
        assert daemon.call("process.list")["processes"] == []
        assert daemon.call("lease.list")["leases"] == []
    finally:
        daemon.close()


def test_ended_while_down_is_readable_and_a_restart_without_keep_stops_the_adopted(
    root: Path, tmp_short: Path, pids: list[ProcId]
) -> None:
    write_config(root, CONFIG + "keep_processes = true\n")
    checkout = tmp_short / "checkouts" / "w"
    ws = insert_workspace(root, checkout)
    daemon = DaemonProcess(root).start()
    try:
        quits = spawn(daemon, ws, "agent", ["sh", "-c", WAIT_FOR_STOP_FILE])
        stays = spawn(daemon, ws, "mcp", ["sleep", "60"])
        pids += [identify(quits["pid"]), identify(stays["pid"])]
        until(lambda: text_with(daemon, quits["id"], "hello"))
        shutdown_watching_events(daemon)
        (checkout / "stop").touch()  # the agent ends while no daemon runs
        until(lambda: not alive(pids[0]))
        write_config(root, CONFIG)  # the next daemon does not keep processes
        daemon.start()
        ended = daemon.call("process.get", {"process_id": quits["id"]})["process"]
        assert ended["state"] == "exited" and ended["exit"]["settled_by"] == "unknown"
        assert output(daemon, quits["id"])["data"] == "hello\nbye\n"
        adopted = daemon.call("process.get", {"process_id": stays["id"]})["process"]
        assert adopted["adopted"] and adopted["on_daemon_stop"] == "stop"
        events = shutdown_watching_events(daemon)
        assert not [e for e in events if e["type"] == "process.kept"]
        assert not alive(pids[1])
        assert list((root / "processes").iterdir()) == []
    finally:
        daemon.close()
