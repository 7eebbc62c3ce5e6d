"""Start-up of two trees side by side: `python -m bench.pair BASE [--repeats N]`.

BASE is a checkout (or `git archive`) of another revision, e.g.
`mkdir /tmp/base && git archive main | tar -x -C /tmp/base`. Its `daemon`, `protocol` and
`clients` go first on PYTHONPATH (before this venv's editable install), so both trees run with
the same interpreter and packages. Each repetition alternates: the echo floor, BASE's xumd, this
tree's xumd, then `python -c pass`, BASE's `xum status`, this tree's `xum status`, so that the
load of a shared machine falls on all alike. For each it reports the medians of wall time and of
CPU time (user + system: it moves much less with the load), plus for the daemons idle RSS and
the time from SIGTERM to exit. Bytecode is written first for both trees (as bench/__main__.py
does), and the measured starts reuse a root whose database exists.

`--records N` adds, in the same alternation, each tree's daemon on a root filled by
`bench.scale.populate` (N workspaces, N/10 cleanup obligations) and this tree's on a root with
one workspace, and prints each tree's time to ready with records minus empty, and this tree's
records minus one record (the same start: the records' own share), wall and CPU at READY=1. Each
records root starts with its database as populated. A root with records may build its feature
graph after READY=1 (xumd.startup.lazy_start): its idle RSS is read after `daemon.status`, which
waits for it.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import py_compile
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from bench import procs, scale

HERE = Path(__file__).resolve().parent.parent
PARTS = ("daemon", "protocol", "clients")
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _status_calls(path: Path, count: int = 20) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        stream = sock.makefile("rwb")
        hello = {"protocol": "1.0", "client": {"name": "bench-pair"}}
        messages = [{"jsonrpc": "2.0", "id": 0, "method": "hello", "params": hello}]
        messages += [
            {"jsonrpc": "2.0", "id": i + 1, "method": "daemon.status"} for i in range(count)
        ]
        for message in messages:
            stream.write(json.dumps(message).encode() + b"\n")
            stream.flush()
            stream.readline()


@contextlib.contextmanager
def ready_process(
    argv: list[str], env: dict[str, str], timeout: float = 120.0
) -> Iterator[tuple[subprocess.Popen[bytes], float]]:
    """`argv` started with a NOTIFY_SOCKET of its own, yielded once it sent READY=1, with the
    seconds that took; killed if it still runs when the block is left."""
    notify_dir = procs.short_dir("xbp-")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_dir / "n"))
    notify.settimeout(timeout)
    try:
        started = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            env={**env, "NOTIFY_SOCKET": str(notify_dir / "n")},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while "READY=1" not in notify.recv(4096).decode().split("\n"):
                pass
            yield proc, time.perf_counter() - started
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        notify.close()
        shutil.rmtree(notify_dir, ignore_errors=True)


def _daemon(
    argv: list[str], env: dict[str, str], sock: Path, timeout: float = 120.0
) -> list[float]:
    """[ms to READY=1, CPU ms at READY=1, idle RSS MiB, ms from SIGTERM to exit]."""
    with ready_process(argv, env, timeout) as (proc, ready):
        cpu = _cpu_s(proc.pid)
        if "xumd" in argv:
            _status_calls(sock)
        time.sleep(0.3)  # idle means idle: let the loop settle before sampling
        rss = _rss_mib(proc.pid)
        stopping = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout)
        stop = time.perf_counter() - stopping
    return [ready * 1e3, cpu * 1e3, rss, stop * 1e3]


def _command(argv: list[str], env: dict[str, str]) -> list[float]:
    """[wall ms, CPU ms] of one command that must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True, timeout=60)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return [wall * 1e3, cpu * 1e3]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pair", description=__doc__)
    parser.add_argument("base", type=Path, help="the other tree (checkout or git archive)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--records", type=int, default=0, help="also a root with N workspaces")
    args = parser.parse_args(argv)
    base = args.base.resolve()
    for tree in (base, HERE):
        for part in ("daemon/xumd", "protocol/xum_protocol", "clients/xum_client"):
            compileall.compile_dir(
                tree / part, quiet=1, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH
            )
    python = sys.executable
    env = {k: v for k, v in os.environ.items() if k not in ("XUM_SOCKET", "XUM_ROOT")}
    base_env = {**env, "PYTHONPATH": os.pathsep.join(str(base / p) for p in PARTS)}
    work = procs.short_dir("xbp-")
    try:
        roots = {"base": work / "base", "this": work / "this"}
        if args.records:
            roots |= {"base+rec": work / "rb" / "root", "this+rec": work / "rt" / "root"}
            roots["this+one"] = work / "r1" / "root"

        def xumd(which: str) -> list[str]:
            return [python, "-m", "xumd", "--root", str(roots[which]), "--log-level", "warning"]

        daemons = {
            "echo floor": [python, "-m", "bench.echo", str(work / "e.sock")],
            "base": xumd("base"),
            "this tree": xumd("this"),
        }
        envs = {"echo floor": {**env, "PYTHONPATH": procs.repo_path()}, "base": base_env}
        socks = {"echo floor": work / "e.sock", "base": roots["base"] / "xumd.sock"}
        socks["this tree"] = roots["this"] / "xumd.sock"
        if args.records:
            daemons |= {"base+records": xumd("base+rec"), "this+records": xumd("this+rec")}
            daemons["this+1 record"] = xumd("this+one")
            socks["this+1 record"] = roots["this+one"] / "xumd.sock"
            envs["base+records"] = base_env
            socks["base+records"] = roots["base+rec"] / "xumd.sock"
            socks["this+records"] = roots["this+rec"] / "xumd.sock"
        for name in daemons:  # the database exists before the measured starts
            if name != "echo floor":
                _daemon(daemons[name], envs.get(name, env), socks[name])
        if args.records:
            for which in ("base+rec", "this+rec"):
                scale.populate(roots[which], args.records, args.records // 10)
            scale.populate(roots["this+one"], 1, 0)
            # The starts differ in their records only: the empty roots get the records' config.
            for which in ("base", "this"):
                (roots[which] / "config.toml").write_text(scale.SLOW_RETRY)
        pristine = {which: work / f"{which}.db" for which in ("base+rec", "this+rec")}
        for which, copy in pristine.items() if args.records else ():
            shutil.copyfile(roots[which] / "state.db", copy)
        restore = {"base+records": "base+rec", "this+records": "this+rec"}
        results: dict[str, list[list[float]]] = {name: [] for name in daemons}
        cli: dict[str, list[list[float]]] = {"python -c pass": [], "base": [], "this tree": []}
        for _ in range(args.repeats):
            for name, argv_ in daemons.items():
                if name in restore:  # the records as populated, whatever a start wrote
                    which = restore[name]
                    scale._restore(roots[which] / "state.db", pristine[which])
                results[name].append(_daemon(argv_, envs.get(name, env), socks[name]))
        # `xum status` against this tree's daemon, both clients alike.
        server = procs.xumd(roots["this"]).start()
        try:
            status = ["--root", str(roots["this"]), "status"]
            commands = {
                "python -c pass": ([python, "-c", "pass"], env),
                "base": (
                    [python, "-c", "from xum_client.cli import main; main()", *status],
                    base_env,
                ),
                "this tree": ([str(Path(python).parent / "xum"), *status], env),
            }
            for argv_, env_ in commands.values():
                _command(argv_, env_)  # warm-up
            for _ in range(args.repeats * 3):
                for name, (argv_, env_) in commands.items():
                    cli[name].append(_command(argv_, env_))
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(rows: list[list[float]], col: int) -> float:
        return statistics.median(r[col] for r in rows)

    print(f"medians of {args.repeats} (load {os.getloadavg()[0]:.1f}); base: {base}")
    print(f"{'daemon':12} {'ready ms':>9} {'CPU@ready ms':>13} {'RSS MiB':>8} {'stop ms':>8}")
    floor = results["echo floor"]
    for name, rows in results.items():
        cells = [f"{med(rows, c):>{w}.1f}" for c, w in zip(range(4), (9, 13, 8, 8), strict=True)]
        ratio = f"  ({med(rows, 0) / med(floor, 0):.2f}x / {med(rows, 1) / med(floor, 1):.2f}x"
        ratio += f" / RSS {med(rows, 2) / med(floor, 2):.2f}x)"
        print(f"{name:12} {' '.join(cells)}{ratio}")
    if args.records:
        print(f"records minus empty ({args.records} workspaces): wall ms, CPU at READY=1 ms")
        for label, full, empty in (
            ("base", "base+records", "base"),
            ("this tree", "this+records", "this tree"),
            ("this, - 1 rec", "this+records", "this+1 record"),
        ):
            print(
                f"  {label:13} {med(results[full], 0) - med(results[empty], 0):+8.1f} "
                f"{med(results[full], 1) - med(results[empty], 1):+8.1f}"
            )
    print(f"{'xum status':15} {'wall ms':>8} {'CPU ms':>8}")
    base_cli = cli["python -c pass"]
    for name, rows in cli.items():
        print(
            f"{name:15} {med(rows, 0):>8.1f} {med(rows, 1):>8.1f}  "
            f"({med(rows, 0) / med(base_cli, 0):.2f}x / {med(rows, 1) / med(base_cli, 1):.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
