"""The big-repository bench: its synthetic monorepo has the shape it claims (nested packages,
binary files, an ignored build directory; the same tree from the same seed), and its lifecycle
run drives a real daemon through create, archive, unarchive and remove against bare git,
giving one paired value per repetition with the target of each figure (no timing is asserted)."""

from __future__ import annotations

import shutil

from bench import bigrepo, monorepo, procs, targets
from tests.support.gitrepo import git


def test_the_monorepo_is_deterministic_and_shaped_like_one() -> None:
    work = procs.short_dir("xbt-")
    try:
        first = monorepo.make(work / "a", 400)
        second = monorepo.make(work / "b", 400)
        assert git(first, "rev-parse", "HEAD^{tree}") == git(second, "rev-parse", "HEAD^{tree}")
        tracked = git(first, "ls-files").splitlines()
        assert len(tracked) == 401  # the files and the .gitignore
        assert max(p.count("/") for p in tracked) >= 5  # packages/p/src/m/m/m/f
        assert any(p.endswith(monorepo.BINARY_EXT) for p in tracked)
        assert len({p.split("/")[1] for p in tracked if p.startswith("packages/")}) >= 2
        outputs = list((first / "build").rglob("*.o"))
        assert len(outputs) == 400 // monorepo.IGNORED_SHARE
        assert git(first, "check-ignore", str(outputs[0])).strip() == str(outputs[0])
        assert git(first, "status", "--porcelain") == ""  # build outputs are ignored
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_the_lifecycle_run_pairs_each_step_with_bare_git() -> None:
    figures = bigrepo.lifecycle(60, 1)
    assert [targets.key(f) for f in figures] == [
        "bigrepo: workspace.create, no pool",
        "bigrepo: workspace.archive, clean",
        "bigrepo: workspace.unarchive, clean",
        "bigrepo: workspace.remove, clean",
    ]
    for fig in figures:
        assert fig.complete and len(fig.xum) == 1
        assert fig.xum[0] > 0 and fig.baseline[0] > 0
        verdict = targets.verdict(fig)
        assert verdict is not None and verdict["met"] is not None
