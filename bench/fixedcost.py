"""Create and remove, this tree against another xum tree, side by side.

    .venv/bin/python -m bench.fixedcost --other /path/to/other/tree [--files 2000] [--repeats 15]

Two daemons run at once, one from this tree and one from `--other` (its `daemon`, `protocol`
and `clients` on PYTHONPATH), each with its own identical repository, and a third identical
repository for the floor (`git worktree add -b` / `git worktree remove --force`). Every
repetition runs the three in a shuffled order, so load that drifts during the run (a shared
machine) reaches all three alike; each figure is read as the median of per-repetition ratios
over the floor. Every create of the run is measured before its removes (see
`bench.lifecycle.settle_disk`). The other tree is typically `git archive <commit>` of the
commit before a change: "before" and "after" in one run.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import time
from pathlib import Path

from bench import procs, synth
from bench.lifecycle import _wait_trash_empty, _Xum, settle_disk


def _daemon(root: Path, tree: Path | None) -> procs.Launched:
    env = None
    if tree is not None:
        paths = [tree / "daemon", tree / "protocol", tree / "clients", tree]
        env = {"PYTHONPATH": ":".join(str(p) for p in paths)}
    return procs.xumd(root, env=env).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", type=Path, required=True)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    work = procs.short_dir("xbf-")
    launched: list[procs.Launched] = []
    clients: dict[str, _Xum] = {}
    try:
        template = synth.make_template(work / "template", args.files)
        repos = {k: synth.copy(template, work / f"repo-{k}") for k in ("this", "other", "floor")}
        projects: dict[str, str] = {}
        for key, tree in (("this", None), ("other", args.other)):
            daemon = _daemon(work / f"root-{key}", tree)
            launched.append(daemon)
            clients[key] = _Xum(daemon.socket_path)
            added = clients[key].call("project.add", {"path": str(repos[key])})
            projects[key] = added["project"]["id"]
        times: dict[str, list[float]] = {
            f"{k}.{op}": [] for k in ("this", "other", "floor") for op in ("create", "remove")
        }
        # Every create first, then every remove: on an ext4 without a journal a create just
        # after thousands of deletions pays for them (bench.lifecycle.settle_disk).
        made: dict[tuple[str, int], str] = {}
        for op in ("create", "remove"):
            for rep in range(-1, args.repeats):  # -1 warms up, not recorded
                order = ["this", "other", "floor"]
                random.shuffle(order)
                for key in order:
                    settle_disk()
                    name = f"f{rep + 1}"
                    started = time.perf_counter()
                    if key == "floor":
                        path = work / "floor-wt" / name
                        if op == "create":
                            synth.git(
                                repos["floor"], "worktree", "add", "-q", "-b", name, str(path)
                            )
                        else:
                            synth.git(repos["floor"], "worktree", "remove", "--force", str(path))
                    elif op == "create":
                        ws = clients[key].call(
                            "workspace.create", {"project_id": projects[key], "name": name}
                        )
                        made[key, rep] = ws["workspace"]["id"]
                    else:
                        clients[key].call("workspace.remove", {"workspace_id": made[key, rep]})
                    took = (time.perf_counter() - started) * 1000
                    if key != "floor" and op == "remove":
                        _wait_trash_empty(work / f"root-{key}")
                    if rep >= 0:
                        times[f"{key}.{op}"].append(took)
        for op in ("create", "remove"):
            floor = times[f"floor.{op}"]
            for key in ("this", "other"):
                mine = times[f"{key}.{op}"]
                factors = [m / f for m, f in zip(mine, floor, strict=True)]
                print(
                    f"{op:6s} {key:5s} median {statistics.median(mine):8.1f} ms"
                    f"  floor {statistics.median(floor):8.1f} ms"
                    f"  factor min/med/max {min(factors):.2f} / {statistics.median(factors):.2f}"
                    f" / {max(factors):.2f}"
                )
    finally:
        for xum in clients.values():
            xum.close()
        for daemon in launched:
            daemon.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
