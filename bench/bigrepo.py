"""Big repositories: `workspace.create` on the 50,000-file synthetic
repository (`--quick`: the small one) when the main checkout is a cone-mode sparse checkout of one
top-level directory, and when the repository has a submodule; each against a plain
`git worktree add -b` (a full checkout, no submodule initialised) on an identical copy, in the
same run. The sparse figure shows what inheriting the cone saves; the submodule figure what
initialising a submodule from the main checkout's copy costs on top of a plain add.

`python -m bench.bigrepo [--size N] [--repeats R] [--json PATH]` (default 10,000 files;
`--size 100000` for the large one): the lifecycle on the synthetic monorepo
(`bench/monorepo.py`) against bare git on an identical copy, paired in the same run:
create without a pool against `git worktree add -b`; archive of a clean checkout, and remove
of a clean one, each against `git worktree remove --force`; unarchive of the clean archive
against `git worktree add` of its existing branch (a clean archive restores no file, so the
floor is the checkout alone). Every create is measured before anything of the run is deleted,
with `sync` before each pair (`bench.lifecycle.settle_disk`)."""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bench import monorepo, procs, report, synth
from bench.lifecycle import _wait_trash_empty, against_git, paired, served
from bench.settings import Settings
from bench.stats import Figure

ADD = "git worktree add -b (full checkout, identical repository)"
SUBMODULE_FILES = 500


def _cone(repo: Path) -> str:
    """The first top-level directory: the synthetic tree has seven (`bench/synth.py`), so the
    cone holds about a seventh of the files."""
    return sorted(p.name for p in repo.iterdir() if p.is_dir() and p.name != ".git")[0]


def _with_submodule(repo: Path, work: Path) -> None:
    sub = synth.make_template(work / "subsrc", SUBMODULE_FILES, seed=11)
    synth.git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "sub")
    synth.git(repo, "commit", "-q", "-m", "add submodule")


def run(settings: Settings) -> list[Figure]:
    files = settings.small_files if settings.quick else settings.large_files
    tag = f"{files:,} files"
    sparse = Figure("bigrepo", f"workspace.create, sparse cone of one directory ({tag})", "ms", ADD)
    submodule = Figure(
        "bigrepo", f"workspace.create with a {SUBMODULE_FILES}-file submodule ({tag})", "ms", ADD
    )
    work = procs.short_dir("xbb-")
    try:
        template = synth.make_template(work / "template", files)
        sparse_repo = synth.copy(template, work / "sparse")
        sub_repo = synth.copy(template, work / "subrepo")
        floor_repo = synth.copy(template, work / "floor")
        shutil.rmtree(template)
        synth.git(sparse_repo, "sparse-checkout", "set", "--cone", _cone(sparse_repo))
        _with_submodule(sub_repo, work)
        synth.git(floor_repo, "commit", "-q", "--allow-empty", "-m", "same history depth")
        floor_dir = work / "floor-wt"
        floor_dir.mkdir()
        root = work / "root"
        with served(root) as xum:
            sparse_id = xum.call("project.add", {"path": str(sparse_repo)})["project"]["id"]
            sub_id = xum.call("project.add", {"path": str(sub_repo)})["project"]["id"]
            for rep in range(-1, settings.repeats):  # rep -1 warms the page cache, unrecorded
                name = f"b{rep + 1}" if rep >= 0 else "warm"
                results: dict[str, float] = {}
                for kind, project in (("sparse", sparse_id), ("sub", sub_id)):
                    fpath = floor_dir / f"{kind}-{name}"
                    add = ["worktree", "add", "-q", "-b", f"floor/{kind}-{name}", str(fpath)]
                    params = {"project_id": project, "name": f"{kind}-{name}"}
                    x_time, made, f_time = paired(
                        rep,
                        partial(xum.call, "workspace.create", params),
                        partial(synth.git, floor_repo, *add, "HEAD"),
                    )
                    if kind == "sparse" and not made.get("sparse"):
                        raise RuntimeError("the sparse cone was not inherited")
                    if kind == "sub" and made["submodules"][0]["status"] != "initialized":
                        raise RuntimeError(f"submodule not initialised: {made['submodules']}")
                    results[kind] = x_time
                    results[f"floor-{kind}"] = f_time
                    xum.call("workspace.remove", {"workspace_id": made["workspace"]["id"]})
                    synth.git(floor_repo, "worktree", "remove", "--force", str(fpath))
                    _wait_trash_empty(root)
                if rep < 0:
                    continue
                sparse.add(results["sparse"] * 1000, results["floor-sparse"] * 1000)
                submodule.add(results["sub"] * 1000, results["floor-sub"] * 1000)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [sparse, submodule]


REMOVE = "git worktree remove --force"
ADD_EXISTING = "git worktree add (the existing branch; identical repository)"


def lifecycle(files: int, repeats: int) -> list[Figure]:
    """Create, archive, unarchive and remove on the synthetic monorepo against bare git (see
    the module's docstring): each pair alternates which side goes first."""
    tag = f"{files:,} files"
    create = Figure("bigrepo", f"workspace.create, no pool ({tag})", "ms", ADD)
    archive = Figure("bigrepo", f"workspace.archive, clean ({tag})", "ms", REMOVE)
    unarchive = Figure("bigrepo", f"workspace.unarchive, clean ({tag})", "ms", ADD_EXISTING)
    remove = Figure("bigrepo", f"workspace.remove, clean ({tag})", "ms", REMOVE)
    work = procs.short_dir("xbm-")
    root = work / "root"
    try:
        template = monorepo.make(work / "template", files)
        with against_git(work, template) as (xum, project, frepo, fdir):
            names = ["warm", *(f"b{rep}" for rep in range(repeats))]
            ids: dict[str, str] = {}

            def phase(
                figure: Figure,
                mine: Callable[[str], object],
                floor: Callable[[str], object],
                *,
                reclaim: bool = False,
            ) -> None:
                """One step of every name's lifecycle, paired with the floor's (the first,
                `warm`, warms the page cache and is not recorded)."""
                for rep, name in enumerate(names):
                    x, _, f = paired(rep, partial(mine, name), partial(floor, name))
                    if reclaim:
                        _wait_trash_empty(root)
                    if rep:
                        figure.add(x * 1000, f * 1000)

            def create_one(name: str) -> None:
                answer = xum.call("workspace.create", {"project_id": project, "name": name})
                ids[name] = answer["workspace"]["id"]

            def call(method: str) -> Callable[[str], object]:
                return lambda name: xum.call(method, {"workspace_id": ids[name]})

            def git_add(name: str) -> None:
                add = ["worktree", "add", "-q", "-b", f"floor/{name}", str(fdir / name), "HEAD"]
                synth.git(frepo, *add)

            def git_remove(name: str) -> None:
                synth.git(frepo, "worktree", "remove", "--force", str(fdir / name))

            def git_add_existing(name: str) -> None:
                synth.git(frepo, "worktree", "add", "-q", str(fdir / name), f"floor/{name}")

            # Every create first, before anything is deleted (`settle_disk`); then archive of
            # the clean checkouts, unarchive (the floor checks its branch out again), remove.
            phase(create, create_one, git_add)
            phase(archive, call("workspace.archive"), git_remove, reclaim=True)
            phase(unarchive, call("workspace.unarchive"), git_add_existing)
            phase(remove, call("workspace.remove"), git_remove, reclaim=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [create, archive, unarchive, remove]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bigrepo", description=__doc__)
    parser.add_argument("--size", type=int, default=10_000, help="tracked files (100000: large)")
    parser.add_argument("--repeats", type=int, default=3, help="recorded repetitions")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the figures")
    args = parser.parse_args(argv)
    figures = lifecycle(args.size, args.repeats)
    title = f"bigrepo lifecycle ({args.size:,} files, {args.repeats} repetitions"
    report.emit(title, figures, {"size": args.size, "repeats": args.repeats}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
