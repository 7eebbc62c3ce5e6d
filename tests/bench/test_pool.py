"""The warm pool's bench: two real daemons (one root with a pool, one without) on one synthetic
monorepo, each repetition a pool hit, a create without a pool and `git worktree add -b`, giving
one value per repetition to each figure, every figure held to its target (no timing is
asserted)."""

from __future__ import annotations

from bench import pool, targets


def test_each_repetition_gives_a_hit_a_plain_create_and_git() -> None:
    figures = pool.run_size(60, 2)
    assert [targets.key(f) for f in figures] == [
        "pool: workspace.create, pool hit",
        "pool: workspace.create, pool hit, p50",
        "pool: workspace.create, no pool",
    ]
    for fig in figures:
        assert fig.complete and len(fig.xum) == 2
        assert min(fig.xum) > 0 and min(fig.baseline) > 0
        verdict = targets.verdict(fig)
        assert verdict is not None and verdict["met"] is not None
    hit, p50, _plain = figures
    assert hit.xum == p50.xum and hit.baseline == p50.baseline
