"""The bench's target column: every figure of bench/targets.py is held to its bound, in the table
and the JSON (no timing is measured here: figures are built by hand)."""

from __future__ import annotations

import io

from bench import report, targets
from bench.stats import Figure


def _fig(group: str, name: str, xum: list[float], floor: list[float], **kw: object) -> Figure:
    fig = Figure(group, name, "ms", "floor", **kw)  # type: ignore[arg-type]
    for mine, base in zip(xum, floor, strict=True):
        fig.add(mine, base)
    return fig


def test_size_tag_is_not_part_of_the_key() -> None:
    full = _fig("lifecycle", "workspace.create (2,000 files)", [1.0], [1.0])
    quick = _fig("lifecycle", "workspace.create (500 files)", [1.0], [1.0])
    assert targets.key(full) == targets.key(quick) == "lifecycle: workspace.create"
    tput = _fig("rpc", "throughput, 16 client(s)", [1.0], [1.0])
    assert targets.target_of(tput) == targets.Target("factor", 2.0)


def test_factor_target_uses_the_median_of_pairwise_factors() -> None:
    met = _fig("rpc", "daemon.status round trip p50", [140, 150, 900], [100, 100, 100])
    missed = _fig("rpc", "daemon.status round trip p50", [160, 170, 100], [100, 100, 100])
    assert targets.verdict(met) == {
        "kind": "factor",
        "limit": 1.5,
        "label": "<= 1.5x",
        "value": 1.5,
        "met": True,
    }
    assert targets.mark(met) == ("<= 1.5x", "\u2713")
    assert targets.mark(missed) == ("<= 1.5x", "\u2717")


def test_throughput_factor_is_floor_over_xum() -> None:
    fig = _fig("rpc", "throughput, 16 client(s)", [1000.0], [3000.0], higher_is_better=True)
    verdict = targets.verdict(fig)
    assert verdict is not None and verdict["value"] == 3.0 and verdict["met"] is False


def test_delta_target_is_the_median_difference() -> None:
    tag = "(10,000 workspaces, 1,000 obligations)"
    fig = _fig(
        "scale", f"time to ready, records minus one record {tag}", [400, 420, 900], [350, 350, 350]
    )
    verdict = targets.verdict(fig)
    assert verdict is not None and verdict["value"] == 70 and verdict["met"] is False
    assert targets.mark(fig) == ("<= +60 ms (med +70.0)", "\u2717")
    # Against an empty root (what a user compares with) the bound is wider: the difference also
    # holds the feature graph the lean start defers.
    beside = _fig("scale", f"time to ready, records minus empty {tag}", [400, 190], [300, 100])
    verdict = targets.verdict(beside)
    assert verdict is not None and verdict["value"] == 95 and verdict["met"] is True
    memory = _fig("scale", f"idle RSS, records over empty {tag}", [45.0, 46.0], [30.0, 30.0])
    verdict = targets.verdict(memory)
    assert verdict is not None and verdict["value"] == 1.5166666666666666
    assert verdict["met"] is False


def test_value_target_is_the_median_of_xums_own_values() -> None:
    # The warm pool's bound in the unit: 0.3 s, whatever git takes in the same run.
    tag = "(100,000 files)"
    met = _fig("pool", f"workspace.create, pool hit, p50 {tag}", [250, 290, 900], [3000] * 3)
    verdict = targets.verdict(met)
    assert verdict is not None and verdict["value"] == 290 and verdict["met"] is True
    assert targets.mark(met) == ("<= 300 ms (med 290.0)", "\u2713")
    missed = _fig("pool", f"workspace.create, pool hit, p50 {tag}", [310, 320, 100], [9000] * 3)
    assert targets.mark(missed) == ("<= 300 ms (med 310.0)", "\u2717")
    # The same values against the floor: a hit at least 10x faster than git (a factor <= 0.1).
    tenth = _fig("pool", f"workspace.create, pool hit {tag}", [250, 290, 900], [3000] * 3)
    verdict = targets.verdict(tenth)
    assert verdict is not None and verdict["kind"] == "factor" and verdict["met"] is True
    slow = _fig("pool", f"workspace.create, pool hit {tag}", [400, 300], [3000, 2000])
    assert targets.mark(slow) == ("<= 0.1x", "\u2717")


def test_untargeted_and_unmeasured_figures() -> None:
    free = _fig("rpc", "throughput, 128 client(s)", [1.0], [1.0], higher_is_better=True)
    assert targets.verdict(free) is None and targets.mark(free) == ("-", "-")
    empty = Figure("cli", "xum status", "ms", "python -c pass")
    assert targets.mark(empty) == ("<= 2x", "n/a")
    assert targets.verdict(empty) == {
        "kind": "factor",
        "limit": 2.0,
        "label": "<= 2x",
        "value": None,
        "met": None,
    }


def test_table_and_json_carry_the_target() -> None:
    figures = [
        _fig("startup", "idle RSS", [30.0], [20.0]),
        _fig("rpc", "throughput, 1 client(s)", [1.0], [2.0], higher_is_better=True),
    ]
    out = io.StringIO()
    report.table(figures, out)
    lines = out.getvalue().splitlines()
    assert lines[0].split()[-2:] == ["target", "ok"]
    assert lines[2].rstrip().endswith("<= 2x   \u2713")
    assert lines[3].rstrip().endswith("-       -")
    data = report.as_json(figures, {}, {})
    assert data["figures"][0]["target"]["met"] is True
    assert data["figures"][1]["target"] is None


def test_every_targeted_figure_has_a_target() -> None:
    # The eleven rows of the targets' table (p50 and p99 are two figures), the four of the
    # big-repository table and the warm pool's three (a hit's factor and its p50, no pool).
    assert len(targets.TARGETS) == 19
