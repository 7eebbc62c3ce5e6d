"""Named fault points (docs/ARCHITECTURE.md, "Durable write order and crash recovery").

Each step between a durable write and its effect calls a point with a stable name. With
`XUM_FAULT=<name>` in the environment the daemon SIGKILLs itself when it reaches that point, so a
crash test can kill at every point and check the invariants after a restart. With
`XUM_FAULT=<name>:raise` the point raises `FaultInjected` instead, once (an unexpected exception,
as a bug or an unforeseen OS error would): the daemon lives on, and a test checks that the
failure left no row stuck and that a retry goes through. `xumd --list-fault-points` prints every
declared name; a point is declared at import time, so a new point is covered by the crash
harness automatically.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import anyio

ENV_VAR = "XUM_FAULT"
HOLD_DIR_VAR = "XUM_FAULT_HOLD_DIR"
HOLD_MAX_S = 120.0
"""A held point lets go by itself after this long: a forgotten release never wedges a daemon."""
HOLD_POLL_S = 0.02

_registry: dict[str, str] = {}
_simulated: dict[str, str] = {}
_armed: str | None = None
_mode: str = "kill"
MODES = ("kill", "raise")


class FaultInjected(RuntimeError):
    """Raised at an armed point in `raise` mode (deliberately not a XumError: it stands for a
    failure nobody foresaw, answered `internal`)."""


@dataclass(frozen=True, slots=True)
class FaultPoint:
    name: str
    simulate: bool = False

    def __call__(self) -> None:
        if not self.simulate:
            hit(self.name)

    @property
    def active(self) -> bool:
        """A simulation point (declared with simulate=True) is armed: behave as it says.

        Simulation points do not kill the daemon; they stand for a failure that a kill cannot
        produce (a confirmation that never arrives), so the crash harness does not list them.
        """
        return self.simulate and _armed == self.name

    async def hold(self) -> None:
        """A simulation point that pauses: when armed, create `<name>.held` in the directory
        named by XUM_FAULT_HOLD_DIR and wait until the test creates `<name>.release` there
        (bounded by HOLD_MAX_S). It turns a race's timing window into an ordered step a test
        controls, instead of a sleep the test must beat."""
        if not self.active:
            return
        where = Path(os.environ.get(HOLD_DIR_VAR) or ".")
        release = where / f"{self.name}.release"
        (where / f"{self.name}.held").touch()
        sys.stderr.write(f"xumd: fault point {self.name} held\n")
        with anyio.move_on_after(HOLD_MAX_S):
            while not release.exists():
                await anyio.sleep(HOLD_POLL_S)
        # One release lets one pass through; a later arrival holds again.
        release.unlink(missing_ok=True)
        (where / f"{self.name}.held").unlink(missing_ok=True)


def declare(name: str, doc: str = "", *, simulate: bool = False) -> FaultPoint:
    """Declare a point at import time; the same name may be declared once only."""
    if name in _registry or name in _simulated:
        raise RuntimeError(f"fault point {name} declared twice")
    (_simulated if simulate else _registry)[name] = doc
    return FaultPoint(name, simulate)


def all_points() -> dict[str, str]:
    """The kill points (what `--list-fault-points` prints for the crash harness)."""
    return dict(sorted(_registry.items()))


def arm_from_env() -> str | None:
    """Arm the point named by XUM_FAULT (if any); unknown names are a startup error."""
    global _armed, _mode
    name = os.environ.get(ENV_VAR) or None
    mode = "kill"
    if name is not None and ":" in name:
        name, mode = name.split(":", 1)
        if mode not in MODES:
            raise ValueError(f"{ENV_VAR}: mode {mode!r} is not one of {', '.join(MODES)}")
    if name is not None and name not in _registry and name not in _simulated:
        raise ValueError(f"{ENV_VAR}={name!r} names no fault point (see xumd --list-fault-points)")
    _armed = name
    _mode = mode
    return name


def hit(name: str) -> None:
    global _armed
    if _armed is not None and name == _armed and _mode == "raise":
        # Once: a retry in the same daemon then gets past the point (the failure was transient).
        _armed = None
        sys.stderr.write(f"xumd: fault point {name} reached; raising\n")
        raise FaultInjected(f"fault injected at {name}")
    if _armed is not None and name == _armed:
        # No logging framework here: the line must reach stderr before the kill.
        sys.stderr.write(f"xumd: fault point {name} reached; SIGKILL\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
