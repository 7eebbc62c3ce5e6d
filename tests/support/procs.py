"""Process identity in tests: a pid together with its start time, compared the way the daemon's
own liveness rule does (`xumd.system.procstat.same_process_alive`). Pids wrap during a test run
(pid_max is 32768 on the machines we run on): a bare pid that looks alive later may be another
process.
Identify a process while it is known to run (as soon as its pid is read), then ask `alive`."""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass

from xumd.system import procstat


@dataclass(frozen=True, slots=True)
class ProcId:
    pid: int
    start: float | None
    """psutil's create_time when identified; None: it had already exited then."""


def identify(pid: int) -> ProcId:
    return ProcId(pid, procstat.start_time(pid))


def identify_all(pids: Iterable[int]) -> list[ProcId]:
    return [identify(pid) for pid in pids]


def alive(proc: ProcId) -> bool:
    """True while that very process (pid and start time) runs; a zombie is not alive."""
    return proc.start is not None and procstat.same_process_alive(proc.pid, proc.start)


def changed_signals(status: str) -> dict[str, set[int]]:
    """From a process's own `/proc/self/status` lines `SigIgn:`/`SigBlk:`: which of the signals a
    program may set (`signal.valid_signals()`) it ignores and which it blocks. Signals 32 and 33
    belong to the C library (no program can change them: a launcher may leave them ignored)."""
    settable = {int(s) for s in signal.valid_signals()}
    found: dict[str, set[int]] = {}
    for line in status.strip().splitlines():
        name, _, mask = line.partition(":")
        bits = int(mask.strip(), 16)
        found[name] = {s for s in settable if bits >> (s - 1) & 1}
    return found
