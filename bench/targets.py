"""The bench's targets, in one place (docs/PERFORMANCE.md, "The targets"): a figure's key -> the
bound its median must meet.

A figure's key is `group: name` without the trailing parenthesised tag that names the size of the
run ("(2,000 files)", "(10,000 workspaces, ...)"), so a `--quick` run (smaller sizes) is held to
the same bound. A figure without an entry here has no target (its mark is "-").

Two kinds of bound:
- "factor": the median of the pairwise cost factors (above 1 = xum costs that many times the
  floor, for throughput too) is at most `limit`;
- "delta": the median of the pairwise differences xum - floor, in the figure's unit, is at most
  `limit` (an added cost, e.g. what 10,000 records add to the time to ready);
- "value": the median of xum's own values, in the figure's unit, is at most `limit` (a bound a
  user states in seconds, e.g. a create with a warm pool within 0.3 s), held beside a factor
  against the floor on the same values.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any, Literal

from bench.stats import Figure

_TAG = re.compile(r"\s+\([^()]*\)$")


@dataclass(frozen=True, slots=True)
class Target:
    kind: Literal["factor", "delta", "value"]
    limit: float

    def label(self, unit: str) -> str:
        if self.kind == "factor":
            return f"<= {self.limit:g}x"
        if self.kind == "value":
            return f"<= {self.limit:g} {unit}"
        return f"<= +{self.limit:g} {unit}"


TARGETS: dict[str, Target] = {
    "rpc: daemon.status round trip p50": Target("factor", 1.5),
    "rpc: daemon.status round trip p99": Target("factor", 3.0),
    "rpc: throughput, 16 client(s)": Target("factor", 2.0),
    "scale: workspace.list, all": Target("factor", 1.5),
    "startup: time to ready": Target("factor", 2.0),
    # READY=1 is when the socket answers; a root with records reconciles after it ("time to
    # reconciled", no target; docs/PERFORMANCE.md, "Start-up with records").
    "scale: time to ready, records minus one record": Target("delta", 60.0),
    "scale: time to ready, records minus empty": Target("delta", 100.0),
    "scale: idle RSS, records over empty": Target("factor", 1.5),
    "lifecycle: workspace.create": Target("factor", 1.2),
    "lifecycle: workspace.remove, clean": Target("factor", 1.3),
    # The lifecycle on the synthetic monorepo (`python -m bench.bigrepo --size N`).
    "bigrepo: workspace.create, no pool": Target("factor", 1.1),
    "bigrepo: workspace.archive, clean": Target("factor", 1.1),
    "bigrepo: workspace.remove, clean": Target("factor", 1.1),
    "bigrepo: workspace.unarchive, clean": Target("factor", 1.2),
    # The warm pool on the synthetic monorepo (`python -m bench.pool --sizes N`): a hit at least
    # 10x faster than `git worktree add -b` and within 0.3 s; without a pool, bare git's cost.
    "pool: workspace.create, pool hit": Target("factor", 0.1),
    "pool: workspace.create, pool hit, p50": Target("value", 300.0),
    "pool: workspace.create, no pool": Target("factor", 1.1),
    "cli: xum status": Target("factor", 2.0),
    "startup: idle RSS": Target("factor", 2.0),
}


def key(fig: Figure) -> str:
    return f"{fig.group}: {_TAG.sub('', fig.name)}"


def target_of(fig: Figure) -> Target | None:
    return TARGETS.get(key(fig))


def measured(fig: Figure, target: Target) -> float:
    """The median the target is checked against (a factor, a difference or a value in the
    unit)."""
    if target.kind == "factor":
        return float(statistics.median(fig.factors))
    if target.kind == "value":
        return float(statistics.median(fig.xum))
    return float(statistics.median(m - f for m, f in zip(fig.xum, fig.baseline, strict=True)))


def verdict(fig: Figure) -> dict[str, Any] | None:
    """None without a target; else the bound, the measured median and whether it is met (None
    when the figure has no complete measurement)."""
    target = target_of(fig)
    if target is None:
        return None
    out: dict[str, Any] = {
        "kind": target.kind,
        "limit": target.limit,
        "label": target.label(fig.unit),
        "value": None,
        "met": None,
    }
    if fig.complete:
        value = measured(fig, target)
        out["value"] = value
        out["met"] = value <= target.limit
    return out


def mark(fig: Figure) -> tuple[str, str]:
    """(target column, mark column) for the table: the bound (and for a delta or a value the
    measured median), then a check mark, a cross, "-" without a target or "n/a" without a
    measurement."""
    result = verdict(fig)
    if result is None:
        return "-", "-"
    label = str(result["label"])
    if result["met"] is None:
        return label, "n/a"
    if result["kind"] == "delta":
        label += f" (med {result['value']:+.1f})"
    elif result["kind"] == "value":
        label += f" (med {result['value']:.1f})"
    return label, "\u2713" if result["met"] else "\u2717"
