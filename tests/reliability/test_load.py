"""Load: N clients (default 64) for a bounded time doing mixed lifecycle operations on a real
daemon. Held: only the defined errors (busy, conflict, not_found), every request answered
exactly once, daemon memory stable, and at the end git's view of every repository matches the
daemon's rows."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.reliability.budget import SAMPLE, seconds, size
from tests.reliability.lifecycle_support import (
    Conn,
    RpcError,
    check_invariants,
    small_repo,
    wait_cleanup_idle,
)
from tests.support.daemon import DaemonProcess, short_tmpdir, write_config

pytestmark = pytest.mark.reliability

CLIENTS = int(os.environ.get("XUM_LOAD_CLIENTS", str(size(64, 16))))
DURATION_S = float(os.environ.get("XUM_LOAD_SECONDS", str(seconds(60, 15))))
PROJECTS = 4
ALLOWED = {"busy", "conflict", "not_found"}
CALL_TIMEOUT_S = 120.0


@dataclass
class Tally:
    ok: Counter[str] = field(default_factory=Counter)
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    calls: int = 0


@pytest.fixture
def loaded() -> Iterator[tuple[DaemonProcess, dict[str, Path], Path]]:
    tmp = short_tmpdir("xuml-")
    root = tmp / "root"
    write_config(root, "[cleanup]\nbackoff_initial_s = 0.05\nbackoff_max_s = 1.0\n")
    daemon = DaemonProcess(root, log_level="info").start()
    repos = {f"p{i}": small_repo(tmp / f"repo{i}") for i in range(PROJECTS)}
    yield daemon, repos, tmp
    daemon.close()
    shutil.rmtree(tmp, ignore_errors=True)


async def _client(
    index: int,
    sock: Path,
    projects: list[str],
    shared: dict[str, str],
    stop_at: float,
    tally: Tally,
) -> None:
    rng = random.Random(index)
    conn = await Conn.open(sock, hello=True)
    mine: dict[str, str] = {}  # workspace id -> state as this client believes
    serial = 0

    async def call(method: str, params: dict[str, Any]) -> Any:
        tally.calls += 1
        try:
            result = await asyncio.wait_for(conn.call(method, params), CALL_TIMEOUT_S)
        except RpcError as exc:
            tally.errors[(method, exc.kind)] += 1
            if exc.kind not in ALLOWED:
                tally.unexpected.append(f"{method} {params}: {exc.kind}: {exc.error['message']}")
            return None
        tally.ok[method] += 1
        return result

    try:
        while time.monotonic() < stop_at:
            roll = rng.random()
            active = [w for w, s in mine.items() if s == "active"]
            archived = [w for w, s in mine.items() if s == "archived"]
            if roll < 0.25 or not mine:
                serial += 1
                got = await call(
                    "workspace.create",
                    {"project_id": rng.choice(projects), "name": f"c{index}-{serial}"},
                )
                if got:
                    mine[got["workspace"]["id"]] = "active"
                    shared[got["workspace"]["id"]] = got["workspace"]["project_id"]
            elif roll < 0.40 and active:
                ws = rng.choice(active)
                if await call("workspace.archive", {"workspace_id": ws}):
                    mine[ws] = "archived"
                else:
                    mine.pop(ws)  # someone removed it, or it is busy: forget it
            elif roll < 0.50 and archived:
                ws = rng.choice(archived)
                if await call("workspace.unarchive", {"workspace_id": ws}):
                    mine[ws] = "active"
                else:
                    mine.pop(ws)
            elif roll < 0.62 and mine:
                ws = rng.choice(list(mine))
                await call("workspace.remove", {"workspace_id": ws, "force": True})
                mine.pop(ws)
            elif roll < 0.68 and active:
                ws = rng.choice(active)
                serial += 1
                if not await call(
                    "workspace.rename", {"workspace_id": ws, "name": f"r{index}-{serial}"}
                ):
                    mine.pop(ws)
            elif roll < 0.74 and shared:
                # Someone else's workspace, maybe gone by now: not_found is a fine answer.
                await call("workspace.get", {"workspace_id": rng.choice(list(shared))})
            elif roll < 0.78 and shared:
                await call(
                    "workspace.remove", {"workspace_id": rng.choice(list(shared)), "force": True}
                )
            elif roll < 0.90:
                await call("workspace.list", {"project_id": rng.choice(projects)})
            else:
                await call("daemon.status", {})
    finally:
        await conn.close()


async def _run_load(sock: Path, projects: list[str], tally: Tally, pid: int) -> list[float]:
    shared: dict[str, str] = {}
    stop_at = time.monotonic() + DURATION_S
    rss: list[float] = []

    async def sample_rss() -> None:
        proc = psutil.Process(pid)
        while time.monotonic() < stop_at:
            rss.append(proc.memory_info().rss / 2**20)
            await asyncio.sleep(0.5)

    await asyncio.gather(
        sample_rss(),
        *(_client(i, sock, projects, shared, stop_at, tally) for i in range(CLIENTS)),
    )
    return rss


def test_mixed_load_keeps_the_contract(
    loaded: tuple[DaemonProcess, dict[str, Path], Path],
) -> None:
    daemon, repos, _ = loaded
    by_id: dict[str, Path] = {}
    with daemon.client() as client:
        for repo in repos.values():
            project = client.call("project.add", {"path": str(repo)})["project"]
            by_id[project["id"]] = repo
    tally = Tally()
    started = time.monotonic()
    rss = asyncio.run(_run_load(daemon.socket_path, list(by_id), tally, daemon.pid))
    elapsed = time.monotonic() - started
    print(
        f"load: {CLIENTS} clients, {elapsed:.1f}s, {tally.calls} calls, ok={dict(tally.ok)}, "
        f"errors={dict(tally.errors)}, rss MiB first/max/last="
        f"{rss[0]:.1f}/{max(rss):.1f}/{rss[-1]:.1f}"
    )
    assert daemon.proc is not None and daemon.proc.poll() is None, "daemon died under load"
    assert not tally.unexpected, "\n".join(tally.unexpected[:10])
    assert tally.ok["workspace.create"] > 0 and tally.ok["workspace.archive"] > 0
    # Memory: after the first seconds' growth (caches, connections), no steady climb.
    settled = rss[len(rss) // 4] if len(rss) >= 4 else rss[0]
    assert rss[-1] < settled * 1.5 + 20, f"RSS climbed from {settled:.1f} to {rss[-1]:.1f} MiB"
    wait_cleanup_idle(daemon.root, 120)
    problems = check_invariants(daemon.root, by_id)
    assert not problems, "\n".join(problems[:20])
    assert SAMPLE or elapsed >= DURATION_S
