"""Big repositories: `workspace.create` on the 50,000-file synthetic
repository (`--quick`: the small one) when the main checkout is a cone-mode sparse checkout of one
top-level directory, and when the repository has a submodule; each against a plain
`git worktree add -b` (a full checkout, no submodule initialised) on an identical copy, in the
same run. The sparse figure shows what inheriting the cone saves; the submodule figure what
initialising a submodule from the main checkout's copy costs on top of a plain add."""

from __future__ import annotations

import shutil
from functools import partial
from pathlib import Path

from bench import procs, synth
from bench.lifecycle import _timed, _wait_trash_empty, _Xum
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
    daemon: procs.Launched | None = None
    xum: _Xum | None = None
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
        daemon = procs.xumd(root).start()
        xum = _Xum(daemon.socket_path)
        sparse_id = xum.call("project.add", {"path": str(sparse_repo)})["project"]["id"]
        sub_id = xum.call("project.add", {"path": str(sub_repo)})["project"]["id"]
        for rep in range(-1, settings.repeats):  # rep -1 warms the page cache, not recorded
            name = f"b{rep + 1}" if rep >= 0 else "warm"
            results: dict[str, float] = {}
            for kind, project in (("sparse", sparse_id), ("sub", sub_id)):
                fpath = floor_dir / f"{kind}-{name}"
                floor_add = partial(
                    synth.git,
                    floor_repo,
                    "worktree",
                    "add",
                    "-q",
                    "-b",
                    f"floor/{kind}-{name}",
                    str(fpath),
                    "HEAD",
                )
                params = {"project_id": project, "name": f"{kind}-{name}"}
                if rep % 2 == 0:
                    x_time, made = xum.timed("workspace.create", params)
                    f_time = _timed(floor_add)
                else:
                    f_time = _timed(floor_add)
                    x_time, made = xum.timed("workspace.create", params)
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
        if xum is not None:
            xum.close()
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(work, ignore_errors=True)
    return [sparse, submodule]
