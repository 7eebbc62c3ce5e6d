"""Whether each copy kept for speed pays: `python -m bench.copies [--repeats N] [--records N]`.

Four pieces of the daemon and the command line repeat what a model or a library already does,
to be faster on a figure a user sees (docs/PERFORMANCE.md, "Copies kept for speed"). Each is
measured here against this same tree with the copy replaced by what it copies, in the same run,
alternated repetition by repetition:

- `config`: ROOT/config.toml validated by `xumd.base.config`'s tables, or by the pydantic models
  `xumd.base.config_schema` derives from them;
- `bytes`: `hello`'s and `daemon.status`'s answers written by `daemon/feature.py` directly, or by
  `HelloResult` / `DaemonStatusResult`;
- `list`: `workspace.list`'s rows built by `lifecycle/listing.py` directly, or each through the
  model path (its `fallback`);
- the `xum status` argv reader (`xum_client/entry.py`), or the click command line.

The lean start's idle status details (`startup/lazy_start.py`) need no variant: without them
`daemon.status` would have to build the feature graph first, which the first feature request
(`project.list`) measures here on the same daemon.

The variants are extracts of HEAD (`git archive`) with one replacement each, run through
PYTHONPATH with the same interpreter (as `bench.pair` runs another tree). Daemons start on an
empty root holding a config.toml; the records (`bench.scale.populate`: workspaces made through
the API, copied to scale, and a tenth as many pending obligations) also give this tree's time to
ready and idle RSS on them against an empty root. Medians.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import procs, scale
from bench.client import Conn
from bench.pair import PARTS, _command, _cpu_s, _rss_mib, ready_process

HERE = Path(__file__).resolve().parent.parent

# (file, what is there, what replaces it): the copy replaced by what it copies.
VARIANTS: dict[str, list[tuple[str, str, str]]] = {
    "config": [
        (
            "daemon/xumd/base/config.py",
            "    try:\n        return DaemonConfig(**data)\n    except Invalid as exc:",
            "    from pydantic import ValidationError\n\n"
            "    from xumd.base import config_schema\n\n"
            "    try:\n        return config_schema.DaemonConfig(**data)  # type: ignore\n"
            "    except ValidationError as exc:",
        )
    ],
    "bytes": [
        (
            "daemon/xumd/daemon/feature.py",
            '    """`hello`\'s result as `HelloResult` serialises it."""\n    return orjson.dumps(',
            '    """`hello`\'s result as `HelloResult` serialises it."""\n'
            "    from xum_protocol.models.daemon import HelloResult\n\n"
            "    return _dump(HelloResult, ",
        ),
        (
            "daemon/xumd/daemon/feature.py",
            '    """`daemon.status`\'s result as `DaemonStatusResult` serialises it."""\n'
            "    return orjson.dumps(",
            '    """`daemon.status`\'s result as `DaemonStatusResult` serialises it."""\n'
            "    from xum_protocol.models.daemon import DaemonStatusResult\n\n"
            "    return _dump(DaemonStatusResult, ",
        ),
        (
            "daemon/xumd/daemon/feature.py",
            "\ndef install(app: App) -> None:",
            "\ndef _dump(model, values):\n    return model(**values).model_dump_json().encode()\n"
            "\n\ndef install(app: App) -> None:",
        ),
    ],
    "list": [
        (
            "daemon/xumd/lifecycle/listing.py",
            '    the rows of one listing."""\n',
            '    the rows of one listing."""\n    return fallback(str(row[0]))\n',
        )
    ],
}

CONFIG = "[cleanup]\nbatch_size = 8\n\n[ports]\ncount = 2\n\n[gc]\narchived_after_days = 30\n"
FIRST: tuple[tuple[str, dict[str, Any]], ...] = (
    ("hello", {"protocol": "1.0", "client": {"name": "bench-copies"}}),
    ("daemon.status", {}),
    ("project.list", {}),
)


def make_tree(name: str, into: Path, rev: str) -> Path:
    """`rev`'s daemon, protocol and clients under `into/name`, with variant `name`'s
    replacements (none for "this")."""
    tree = into / name
    tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(HERE), "archive", rev, *PARTS], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    compileall.compile_dir(tree, quiet=1)
    for rel, old, new in VARIANTS.get(name, []):
        path = tree / rel
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"{name}: {rel} no longer holds the copy this variant replaces")
        path.write_text(text.replace(old, new))
        compileall.compile_file(path, quiet=1)
    return tree


def _start(argv: list[str], env: dict[str, str], sock: Path) -> dict[str, float]:
    """Spawn to READY=1, then to each first answer on one connection: ms since spawn, each
    answer's own ms, and the daemon's CPU ms so far at each (clock ticks: 10 ms)."""
    out: dict[str, float] = {}
    started = time.perf_counter()
    with ready_process(argv, env) as (proc, ready):
        out["ready"] = ready * 1e3
        out["CPU ready"] = _cpu_s(proc.pid) * 1e3
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(sock))
            stream = conn.makefile("rwb")
            for i, (method, params) in enumerate(FIRST):
                sent = time.perf_counter()
                message = {"jsonrpc": "2.0", "id": i, "method": method, "params": params}
                stream.write(json.dumps(message).encode() + b"\n")
                stream.flush()
                assert "result" in json.loads(stream.readline()), method
                now = time.perf_counter()
                out[method] = (now - sent) * 1e3
                out[f"spawn to {method}"] = (now - started) * 1e3
                out[f"CPU {method}"] = _cpu_s(proc.pid) * 1e3
        proc.terminate()
        proc.wait(60)
    return out


def _idle(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    with ready_process(argv, env) as (proc, ready):
        time.sleep(0.3)
        out = {"ready": ready * 1e3, "rss": _rss_mib(proc.pid)}
        proc.terminate()
        proc.wait(60)
    return out


async def _list_ms(sock: Path, count: int) -> list[float]:
    conn = await Conn.open(sock, hello=True)
    try:
        await conn.call("workspace.list", {})
        times = []
        for _ in range(count):
            started = time.perf_counter()
            await conn.call("workspace.list", {})
            times.append((time.perf_counter() - started) * 1e3)
        return times
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.copies", description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--rev", default="HEAD", help="the revision measured (default HEAD)")
    args = parser.parse_args(argv)
    python = sys.executable
    env = {k: v for k, v in os.environ.items() if k not in ("XUM_SOCKET", "XUM_ROOT")}
    work = procs.short_dir("xbc-")
    try:
        trees = {name: make_tree(name, work / "trees", args.rev) for name in ("this", *VARIANTS)}
        envs = {}
        for name, tree in trees.items():
            envs[name] = {**env, "PYTHONPATH": os.pathsep.join(str(tree / p) for p in PARTS)}

        def xumd(root: Path) -> list[str]:
            return [python, "-m", "xumd", "--root", str(root), "--log-level", "warning"]

        roots = {name: work / f"e-{name}" for name in ("this", "config", "bytes")}
        rec, empty, one = work / "rec" / "root", work / "empty", work / "one" / "root"
        for root in [*roots.values(), rec, empty, one]:
            root.mkdir(parents=True)
        for name, root in roots.items():
            (root / "config.toml").write_text(CONFIG)
            _idle(xumd(root), envs[name])  # the database exists before the measured starts
        this = envs["this"]
        tree_path = {"PYTHONPATH": this["PYTHONPATH"]}
        _idle(xumd(empty), this)
        for root in (rec, one):
            procs.xumd(root, env=tree_path).start().stop()
        scale.populate(rec, args.records, args.records // 10, tree_path)
        scale.populate(one, 1, 0, tree_path)
        (empty / "config.toml").write_text(scale.SLOW_RETRY)  # the records' config: same starts
        firsts: dict[str, list[dict[str, float]]] = {name: [] for name in roots}
        starts: dict[str, list[dict[str, float]]] = {"empty": [], "records": []}
        cli: dict[str, list[float]] = {"python -c pass": [], "entry": [], "click": []}
        lists: dict[str, list[float]] = {"this": [], "list": []}
        # `xum status` asks a daemon on a root of its own.
        server = procs.xumd(one, env=tree_path).start()
        status = ["--root", str(one), "status"]
        commands = {
            "python -c pass": [python, "-c", "pass"],
            "entry": [python, "-c", "from xum_client.entry import main; main()", *status],
            "click": [python, "-c", "from xum_client.cli import main; main()", *status],
        }
        try:
            for cmd in commands.values():
                _command(cmd, this)  # warm-up
            for _ in range(args.repeats):
                for name, root in roots.items():
                    firsts[name].append(_start(xumd(root), envs[name], root / "xumd.sock"))
                for label, root in (("empty", empty), ("records", rec)):
                    starts[label].append(_idle(xumd(root), this))
                for _ in range(3):
                    for name, cmd in commands.items():
                        cli[name].append(_command(cmd, this)[0])
                for name in lists:
                    daemon = procs.xumd(rec, env={"PYTHONPATH": envs[name]["PYTHONPATH"]})
                    daemon.start(timeout=120)
                    try:
                        lists[name] += asyncio.run(_list_ms(daemon.socket_path, 3))
                    finally:
                        daemon.stop()
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(args, firsts, starts, cli, lists)
    return 0


def _med(rows: list[dict[str, float]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


def report(
    args: Any,
    firsts: dict[str, list[dict[str, float]]],
    starts: dict[str, list[dict[str, float]]],
    cli: dict[str, list[float]],
    lists: dict[str, list[float]],
) -> None:
    print(f"medians of {args.repeats} (load {os.getloadavg()[0]:.1f})")
    print("empty root with a config.toml, ms (spawn to ...; each first answer's own)")
    keys = ["ready", "spawn to hello", "spawn to daemon.status", "hello", "daemon.status"]
    keys += ["project.list", "CPU ready", "CPU hello", "CPU daemon.status"]
    for name, rows in firsts.items():
        print(f"  {name}: " + ", ".join(f"{k} {_med(rows, k):.1f}" for k in keys))
    print(f"time to ready and idle RSS, {args.records:,} records (this tree)")
    for label, rows in starts.items():
        print(f"  {label:8} ready {_med(rows, 'ready'):7.1f} ms  RSS {_med(rows, 'rss'):6.1f} MiB")
    pairs = zip(starts["records"], starts["empty"], strict=True)
    deltas = [r["ready"] - e["ready"] for r, e in pairs]
    ratios = [r["rss"] / e["rss"] for r, e in zip(starts["records"], starts["empty"], strict=True)]
    print(
        f"  records minus empty {statistics.median(deltas):+.1f} ms; "
        f"RSS records / empty {statistics.median(ratios):.2f}x"
    )
    floor = statistics.median(cli["python -c pass"])
    print("xum status, wall ms")
    for name, times in cli.items():
        median = statistics.median(times)
        print(f"  {name:15} {median:7.1f}  ({median / floor:.2f}x)")
    print(f"workspace.list, {args.records:,} records, ms")
    for name, times in lists.items():
        print(f"  {name:15} {statistics.median(times):7.1f}")


if __name__ == "__main__":
    sys.exit(main())
