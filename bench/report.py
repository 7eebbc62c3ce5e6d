"""Output: a fixed-width table for people, JSON for tools."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from typing import Any, TextIO

import psutil

from bench import targets
from bench.stats import Figure, Spread


def _num(value: float) -> str:
    if value == float("inf"):
        return "inf"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"


def _triple(spread: Spread) -> str:
    return f"{_num(spread.min)} / {_num(spread.median)} / {_num(spread.max)}"


def table(figures: list[Figure], out: TextIO) -> None:
    headers = (
        "figure",
        "unit",
        "xum min/med/max",
        "floor min/med/max",
        "cost x (min/med/max)",
        "target",
        "ok",
    )
    rows: list[tuple[str, ...]] = []
    for fig in figures:
        bound, ok = targets.mark(fig)
        if not fig.complete:
            rows.append(
                (f"{fig.group}: {fig.name}", fig.unit, "n/a", "n/a", fig.note or "n/a", bound, ok)
            )
            continue
        rows.append(
            (
                f"{fig.group}: {fig.name}",
                fig.unit,
                _triple(Spread.of(fig.xum)),
                _triple(Spread.of(fig.baseline)),
                _triple(Spread.of(fig.factors)),
                bound,
                ok,
            )
        )
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out.write(line + "\n" + "-" * len(line) + "\n")
    for row in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + "\n")
    out.write("\nfloors (baselines):\n")
    for fig in figures:
        note = f"  [{fig.note}]" if fig.note and fig.complete else ""
        out.write(f"  {fig.group}: {fig.name}: {fig.baseline_name}{note}\n")


def _git_version() -> str:
    try:
        return subprocess.run(
            ["git", "--version"], capture_output=True, text=True, check=False, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for text in info:
                if text.startswith("model name"):
                    cpu = text.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": psutil.cpu_count(),
        "memory_mib": psutil.virtual_memory().total // (1024 * 1024),
        "git": _git_version(),
        "load_avg_at_start": [round(x, 2) for x in psutil.getloadavg()],
    }


def as_json(
    figures: list[Figure], settings: dict[str, Any], host: dict[str, Any]
) -> dict[str, Any]:
    return {
        "machine": host,
        "settings": settings,
        "figures": [{**f.as_dict(), "target": targets.verdict(f)} for f in figures],
    }


def emit(
    title: str, figures: list[Figure], settings: dict[str, Any], json_path: str | None
) -> None:
    """A standalone bench's output: `title` with the machine, the table on stdout, and the
    figures as JSON at `json_path` when given."""
    host = machine()
    sys.stdout.write(f"{title}; {host['cpus']} CPUs, {host['cpu']}, {host['git']})\n\n")
    table(figures, sys.stdout)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as out:
            out.write(json.dumps(as_json(figures, settings, host), indent=2))
