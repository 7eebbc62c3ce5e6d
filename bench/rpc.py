"""RPC figures: daemon.status round trip (p50/p99), throughput at 1/16/128 clients, idle RSS,
time to ready; each against the bare asyncio echo server (bench.echo) in the same repetition."""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import procs
from bench.client import Conn
from bench.settings import Settings
from bench.stats import Figure, percentile

ECHO = "bare asyncio NDJSON echo server on a Unix socket (bench/echo.py)"


async def _round_trips(path: Path, count: int) -> list[float]:
    """`count` sequential daemon.status calls on one connection; seconds per call."""
    conn = await Conn.open(path, hello=True)
    try:
        for _ in range(min(200, count)):  # warm-up: caches, allocator, branch predictors
            await conn.call("daemon.status")
        out: list[float] = []
        for _ in range(count):
            started = time.perf_counter()
            await conn.call("daemon.status")
            out.append(time.perf_counter() - started)
        return out
    finally:
        await conn.close()


async def _throughput(path: Path, clients: int, seconds: float) -> float:
    """Completed daemon.status calls per second with `clients` connections calling in a loop."""
    conns = [await Conn.open(path, hello=True) for _ in range(clients)]
    done = 0
    stop_at = 0.0

    async def loop(conn: Conn) -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            await conn.call("daemon.status")
            done += 1

    try:
        for conn in conns:  # one warm-up call each, outside the window
            await conn.call("daemon.status")
        started = time.perf_counter()
        stop_at = started + seconds
        await asyncio.gather(*(loop(c) for c in conns))
        return done / (time.perf_counter() - started)
    finally:
        for conn in conns:
            await conn.close()


async def _settle_and_rss(proc: procs.Launched, path: Path) -> int:
    conn = await Conn.open(path, hello=True)
    for _ in range(20):
        await conn.call("daemon.status")
    await conn.close()
    await asyncio.sleep(0.5)  # idle means idle: let the loop settle before sampling
    return proc.rss_bytes()


def _xum_argv() -> list[str]:
    """The installed `xum` script next to this interpreter (what a hook runs), else the module."""
    script = Path(sys.executable).parent / "xum"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from xum_client.cli import main; main()"]


def _timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        argv, check=False, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(
            f"{argv} exited {done.returncode}: {done.stderr.decode(errors='replace')}"
        )
    return took


def _cli_pair(socket_path: Path, runs: int) -> tuple[float, float]:
    """Median wall time (s) of `xum status` against the running daemon and of `python -c pass`,
    alternated so that load on the machine falls on both alike."""
    env = {**os.environ, "XUM_SOCKET": str(socket_path)}
    env.pop("XUM_ROOT", None)
    xum = [*_xum_argv(), "status"]
    floor = [sys.executable, "-c", "pass"]
    mine: list[float] = []
    base: list[float] = []
    _timed(xum, env)  # warm-up: page cache of the imports
    for _ in range(runs):
        mine.append(_timed(xum, env))
        base.append(_timed(floor, env))
    return statistics.median(mine), statistics.median(base)


def run(settings: Settings) -> list[Figure]:
    ready = Figure(
        "startup", "time to ready (no workspaces)", "ms", "python + asyncio server, READY=1"
    )
    rss = Figure("startup", "idle RSS", "MiB", "the echo server process")
    p50 = Figure("rpc", "daemon.status round trip p50", "us", ECHO)
    p99 = Figure("rpc", "daemon.status round trip p99", "us", ECHO)
    tput = {
        c: Figure("rpc", f"throughput, {c} client(s)", "req/s", ECHO, higher_is_better=True)
        for c in settings.concurrency
    }
    cli = Figure("cli", "xum status", "ms", "python -c pass (same interpreter)")
    work = procs.short_dir("xbr-")
    root = work / "root"
    try:
        # First start creates the root and its database; the measured starts reuse it.
        procs.xumd(root).start().stop()
        for rep in range(settings.repeats):
            echo_sock = work / f"echo{rep}.sock"
            echo = procs.echo_server(echo_sock).start()
            daemon = procs.xumd(root).start()
            try:
                assert echo.ready_s is not None and daemon.ready_s is not None
                ready.add(daemon.ready_s * 1000, echo.ready_s * 1000)
                rss.add(
                    asyncio.run(_settle_and_rss(daemon, daemon.socket_path)) / 2**20,
                    asyncio.run(_settle_and_rss(echo, echo_sock)) / 2**20,
                )
                base = asyncio.run(_round_trips(echo_sock, settings.rtt_requests))
                mine = asyncio.run(_round_trips(daemon.socket_path, settings.rtt_requests))
                p50.add(percentile(mine, 50) * 1e6, percentile(base, 50) * 1e6)
                p99.add(percentile(mine, 99) * 1e6, percentile(base, 99) * 1e6)
                for clients, fig in tput.items():
                    floor = asyncio.run(_throughput(echo_sock, clients, settings.throughput_s))
                    xum = asyncio.run(
                        _throughput(daemon.socket_path, clients, settings.throughput_s)
                    )
                    fig.add(xum, floor)
                cli_mine, cli_base = _cli_pair(daemon.socket_path, 3 if settings.quick else 5)
                cli.add(cli_mine * 1000, cli_base * 1000)
            finally:
                daemon.stop()
                echo.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [ready, rss, p50, p99, *tput.values(), cli]
