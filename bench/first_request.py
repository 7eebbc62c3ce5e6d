"""What a daemon's first requests cost, two trees side by side:
`python -m bench.first_request BASE [--repeats N]`.

A lean start (docs/PERFORMANCE.md, "Lean start") loads at a method's first request
what it used to load before READY=1: the params models at the first `hello`, the feature graph
at the first feature request. Per repetition and per tree (BASE through PYTHONPATH, as
bench/pair.py runs it, then this tree): a daemon on an empty root (its database made before),
then on one connection `hello`, `hello` again, `daemon.status`, `project.list` (the feature
graph's first request), `project.list` again, each timed by the client (wall) and by the
daemon's CPU time around it (/proc/PID/stat, in clock ticks: 10 ms). Medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import procs
from bench.pair import PARTS, _cpu_s, ready_process

STEPS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("hello", "hello", {"protocol": "1.0", "client": {"name": "bench-first"}}),
    ("hello again", "hello", {"protocol": "1.0"}),
    ("daemon.status", "daemon.status", {}),
    ("project.list (first feature request)", "project.list", {}),
    ("project.list again", "project.list", {}),
)


def _one(argv: list[str], env: dict[str, str], sock: Path) -> list[tuple[float, float]]:
    with ready_process(argv, env) as (proc, _):
        out = []
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(sock))
            stream = conn.makefile("rwb")
            for i, (_, method, params) in enumerate(STEPS):
                cpu = _cpu_s(proc.pid)
                started = time.perf_counter()
                message = {"jsonrpc": "2.0", "id": i, "method": method, "params": params}
                stream.write(json.dumps(message).encode() + b"\n")
                stream.flush()
                answer = json.loads(stream.readline())
                wall = time.perf_counter() - started
                assert "result" in answer, answer
                out.append((wall * 1e3, (_cpu_s(proc.pid) - cpu) * 1e3))
        proc.terminate()
        proc.wait(60)
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.first_request", description=__doc__)
    parser.add_argument("base", type=Path, help="the other tree (checkout or git archive)")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    base = args.base.resolve()
    env = {k: v for k, v in os.environ.items() if k not in ("XUM_SOCKET", "XUM_ROOT")}
    envs = {"base": {**env, "PYTHONPATH": os.pathsep.join(str(base / p) for p in PARTS)}}
    envs["this tree"] = env
    work = procs.short_dir("xbf-")
    try:
        runs: dict[str, list[list[tuple[float, float]]]] = {name: [] for name in envs}
        roots = {name: work / name.replace(" ", "-") for name in envs}
        argvs = {
            name: [sys.executable, "-m", "xumd", "--root", str(root), "--log-level", "warning"]
            for name, root in roots.items()
        }
        for name, env_ in envs.items():  # the database exists before the measured starts
            _one(argvs[name], env_, roots[name] / "xumd.sock")
        for _ in range(args.repeats):
            for name, env_ in envs.items():
                runs[name].append(_one(argvs[name], env_, roots[name] / "xumd.sock"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"medians of {args.repeats} (load {os.getloadavg()[0]:.1f}); base: {base}")
    print(f"{'request':40} " + " ".join(f"{n + ' wall/CPU ms':>24}" for n in envs))
    for i, (label, _, _) in enumerate(STEPS):
        cells = []
        for name in envs:
            wall = statistics.median(run[i][0] for run in runs[name])
            cpu = statistics.median(run[i][1] for run in runs[name])
            cells.append(f"{wall:>14.1f} / {cpu:>6.1f}")
        print(f"{label:40} " + " ".join(f"{c:>24}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
