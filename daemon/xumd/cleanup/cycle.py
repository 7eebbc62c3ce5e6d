"""One bounded background cycle of a lane: up to `batch_size` due workspaces, starting after the
lane's rotating cursor, so a target that keeps failing cannot starve the others. A workspace a
request is running right now is skipped (that request records the outcome).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xumd.base.config import CleanupConfig
from xumd.cleanup.obligations import Obligations
from xumd.cleanup.runner import StepRunner
from xumd.cleanup.schedule import LANES, Clock


@dataclass
class CycleResult:
    attempted: list[str] = field(default_factory=list)
    """Workspaces whose steps were attempted."""
    skipped: int = 0
    """Due workspaces skipped because another task is running them."""
    full: bool = False
    """The batch was full: more may be due right now."""
    next_due: float | None = None


class LaneCycles:
    def __init__(
        self, obligations: Obligations, runner: StepRunner, clock: Clock, config: CleanupConfig
    ) -> None:
        self.obligations = obligations
        self.runner = runner
        self.clock = clock
        self.config = config
        self._cursor: dict[str, str | None] = {lane: None for lane in LANES}

    async def run(self, lane: str, *, limit: int | None = None) -> CycleResult:
        kinds = LANES[lane]
        batch = limit or self.config.batch_size
        now = self.clock.time()
        cursor = self._cursor[lane]
        targets = self.obligations.due_workspaces(now, kinds, after=cursor, limit=batch)
        if len(targets) < batch and cursor is not None:
            # Wrap around: the targets at or before the cursor come after those past it.
            wrapped = self.obligations.due_workspaces(now, kinds, after=None, limit=batch)
            targets += [t for t in wrapped if t not in targets and t <= cursor][
                : batch - len(targets)
            ]
        result = CycleResult(full=len(targets) >= batch)
        for workspace_id in targets:
            self._cursor[lane] = workspace_id
            lock = self.runner.lock(workspace_id, lane)
            if lock.locked():
                result.skipped += 1  # a request is running it now; it records the outcome
                continue
            async with lock:
                if await self.runner.run_steps(workspace_id, lane, force=False):
                    result.attempted.append(workspace_id)
        result.next_due = self.obligations.next_due(kinds)
        return result
