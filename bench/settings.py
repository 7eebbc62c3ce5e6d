"""Run settings shared by every suite."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Settings:
    quick: bool = False
    repeats: int = 5
    large: bool = False
    rtt_requests: int = 3000
    throughput_s: float = 3.0
    concurrency: tuple[int, ...] = (1, 16, 128)
    small_files: int = 2000
    large_files: int = 50000
    list_workspaces: int = 10000
    list_obligations: int = 1000
    list_page: int = 100
    parallel_creates: int = 64
    subscribers: int = 100

    @classmethod
    def make(cls, *, quick: bool, repeats: int | None, large: bool) -> Settings:
        if quick:
            return cls(
                quick=True,
                repeats=repeats or 3,
                large=large,
                rtt_requests=500,
                throughput_s=1.0,
                small_files=500,
                list_workspaces=2000,
                list_obligations=200,
                parallel_creates=16,
                subscribers=100,
            )
        return cls(repeats=repeats or 5, large=large)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
