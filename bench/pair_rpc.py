"""Request cost of two trees side by side: `python -m bench.pair_rpc BASE [--repeats N]`.

BASE is a checkout (or `git archive`) of another revision, as for `bench.pair`. Each repetition
starts the echo floor, BASE's xumd and this tree's xumd in turn (so that the load of a shared
machine falls on all alike) and measures, on each: one connection calling an unknown method
(transport, envelope and error answer only), `hello`, then `daemon.status`, sequentially; then
16 connections calling `daemon.status` in a loop. For each it reports the medians of the wall
time per call and of the server's CPU time per call (user + system from /proc, which moves
much less with the load than wall time): the CPU figure is the one to compare on a busy
machine. Against the echo floor every method is the same echo.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from bench import procs
from bench.client import Conn, RpcError
from bench.pair import PARTS, _cpu_s

HELLO = {"protocol": "1.0", "client": {"name": "bench-pair-rpc"}}
CASES = ("unknown method", "hello", "daemon.status", "daemon.status, 16 clients")


async def _sequential(path: Path, method: str, count: int, pid: int) -> tuple[float, float]:
    """Seconds of wall time and of `pid`'s CPU time for `count` sequential calls on one
    connection (after a warm-up that neither counts)."""
    conn = await Conn.open(path)
    params = HELLO if method == "hello" else None
    name = "no.such.method" if method == "unknown method" else method

    async def one() -> None:
        try:
            await conn.call(name, params)
        except RpcError:
            pass  # the unknown method's answer

    try:
        for _ in range(min(200, count)):  # warm-up
            await one()
        cpu = _cpu_s(pid)
        started = time.perf_counter()
        for _ in range(count):
            await one()
        return time.perf_counter() - started, _cpu_s(pid) - cpu
    finally:
        await conn.close()


async def _parallel(path: Path, clients: int, count: int, pid: int) -> tuple[float, float]:
    """Seconds of wall time and of `pid`'s CPU time for `count` daemon.status calls spread
    over `clients` loops."""
    conns = [await Conn.open(path) for _ in range(clients)]
    share = count // clients

    async def loop(conn: Conn) -> None:
        for _ in range(share):
            await conn.call("daemon.status")

    try:
        for conn in conns:
            await conn.call("daemon.status")
        cpu = _cpu_s(pid)
        started = time.perf_counter()
        await asyncio.gather(*(loop(c) for c in conns))
        return time.perf_counter() - started, _cpu_s(pid) - cpu
    finally:
        for conn in conns:
            await conn.close()


def _measure(server: procs.Launched, path: Path, count: int) -> dict[str, tuple[float, float]]:
    """Per case: (wall µs per call, server CPU µs per call)."""
    out: dict[str, tuple[float, float]] = {}
    # Not counted: whatever the server still does after READY, and the first connection's
    # costs (the first case measured was ~2x the others on the echo server itself).
    asyncio.run(_sequential(path, "daemon.status", count // 4, server.pid))
    for case in CASES:
        if case.endswith("16 clients"):
            wall, cpu = asyncio.run(_parallel(path, 16, count, server.pid))
        else:
            wall, cpu = asyncio.run(_sequential(path, case, count, server.pid))
        out[case] = (wall / count * 1e6, cpu / count * 1e6)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pair_rpc", description=__doc__)
    parser.add_argument("base", type=Path, help="the other tree (checkout or git archive)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=4000, help="calls per case and start")
    args = parser.parse_args(argv)
    base = args.base.resolve()
    env = {k: v for k, v in os.environ.items() if k not in ("XUM_SOCKET", "XUM_ROOT")}
    base_env = {**env, "PYTHONPATH": os.pathsep.join(str(base / p) for p in PARTS)}
    work = procs.short_dir("xbr-")
    results: dict[str, list[dict[str, tuple[float, float]]]] = {
        "echo floor": [],
        "base": [],
        "this tree": [],
    }
    try:
        for _ in range(args.repeats):
            for name, runs in results.items():
                if name == "echo floor":
                    path = work / "e.sock"
                    server = procs.echo_server(path)
                else:
                    root = work / name.replace(" ", "-")
                    server = procs.xumd(root, env=base_env if name == "base" else env)
                    path = root / "xumd.sock"
                server.start()
                try:
                    runs.append(_measure(server, path, args.calls))
                finally:
                    server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"medians of {args.repeats} starts x {args.calls} calls (load {os.getloadavg()[0]:.1f})")
    print(f"base: {base}")
    print(f"{'server':11} {'case':27} {'wall µs':>8} {'CPU µs':>7}   vs floor (wall / CPU)")
    floor = results["echo floor"]
    for name, runs in results.items():
        for case in CASES:
            wall = statistics.median(r[case][0] for r in runs)
            cpu = statistics.median(r[case][1] for r in runs)
            floor_wall = statistics.median(r[case][0] for r in floor)
            floor_cpu = statistics.median(r[case][1] for r in floor)
            print(
                f"{name:11} {case:27} {wall:8.1f} {cpu:7.1f}   "
                f"{wall / floor_wall:.2f}x / {cpu / floor_cpu:.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
