"""Held fault points (xumd.base.faults.FaultPoint.hold): the daemon pauses at a simulate point until
the test releases it, so a race's window is an ordered step instead of a sleep to beat."""

from __future__ import annotations

from pathlib import Path

from tests.support.wait import until

HOLD_DIR_VAR = "XUM_FAULT_HOLD_DIR"


def hold_env(point: str, where: Path) -> dict[str, str]:
    """The daemon environment that arms `point` as a hold, signalling in `where`."""
    where.mkdir(parents=True, exist_ok=True)
    return {"XUM_FAULT": point, HOLD_DIR_VAR: str(where)}


def wait_held(point: str, where: Path, timeout: float = 20.0) -> None:
    until((where / f"{point}.held").exists, timeout=timeout, message=f"{point} held")


def release(point: str, where: Path) -> None:
    (where / f"{point}.release").touch()
