"""Figures: xum's measurement and its floor's, taken pairwise in the same run.

A figure holds one xum value and one baseline value per repetition. The cost factor of a
repetition is xum/baseline for costs (time, memory) and baseline/xum for rates (throughput), so a
factor above 1 always means "xum costs that many times the floor". Pairing each repetition's two
values (rather than comparing two medians) keeps a noisy neighbour on a shared machine from
skewing one side only.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


@dataclass(frozen=True, slots=True)
class Spread:
    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(min(values), statistics.median(values), max(values))

    def as_dict(self) -> dict[str, float]:
        return {"min": self.min, "median": self.median, "max": self.max}


@dataclass
class Figure:
    group: str
    name: str
    unit: str
    baseline_name: str
    higher_is_better: bool = False
    xum: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    note: str = ""

    def add(self, xum: float, baseline: float) -> None:
        self.xum.append(xum)
        self.baseline.append(baseline)

    @property
    def factors(self) -> list[float]:
        out: list[float] = []
        for mine, floor in zip(self.xum, self.baseline, strict=True):
            num, den = (floor, mine) if self.higher_is_better else (mine, floor)
            out.append(num / den if den > 0 else float("inf"))
        return out

    @property
    def complete(self) -> bool:
        return bool(self.xum) and len(self.xum) == len(self.baseline)

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "group": self.group,
            "name": self.name,
            "unit": self.unit,
            "baseline": self.baseline_name,
            "higher_is_better": self.higher_is_better,
            "runs": len(self.xum),
            "note": self.note,
        }
        if self.complete:
            data["xum_values"] = self.xum
            data["baseline_values"] = self.baseline
            data["xum_spread"] = Spread.of(self.xum).as_dict()
            data["baseline_spread"] = Spread.of(self.baseline).as_dict()
            data["cost_factor"] = Spread.of(self.factors).as_dict()
        return data
