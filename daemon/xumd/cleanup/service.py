"""CleanupService: plans obligations (inside the caller's transaction), runs them in order, fenced,
under the directory exclusion, and records every outcome (completed, pending with backoff, or
abandoned with a reason). It is cleanup-only: it never archives, never removes a workspace row, and
never acts on a live workspace (see fence.py).

Two lanes: `path` (teardown, trash: what frees the path) and `reclaim` (deleting trash entries,
which may take minutes), so a large reclaim never delays another workspace's path.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.cleanup import (
    OBLIGATION_EVENT,
    CleanupStatus,
    CleanupSummary,
    ReclaimStatus,
)

from xumd import logs
from xumd.app import App
from xumd.cleanup import steps as steps_mod
from xumd.cleanup.backoff import Backoff
from xumd.cleanup.clock import Clock, SystemClock
from xumd.cleanup.obligations import (
    ABANDONED,
    COMPLETED,
    FAILED,
    PENDING,
    ObligationRow,
    Obligations,
    new_id,
)
from xumd.cleanup.steps import Outcome, Steps, TeardownFn
from xumd.errors import XumError
from xumd.git import Git
from xumd.lifecycle.marker import worktree_admin_dir
from xumd.lifecycle.seams import WorkspaceRef

log = logs.get("xumd.cleanup")

PATH_LANE = "path"
RECLAIM_LANE = "reclaim"
LANES: dict[str, tuple[str, ...]] = {
    PATH_LANE: ("teardown", "trash", "prune", "remove_dir"),
    RECLAIM_LANE: ("reclaim",),
}

SETUP_NEVER_RAN = ("untrusted", "none", "pending", None)
"""Setup statuses under which no setup script of the project ever ran in the checkout."""

KEEP_COMPLETED_S = 24 * 3600.0
KEEP_ABANDONED_S = 7 * 24 * 3600.0


class _DirectoryExclusion(Protocol):
    def directory(
        self, path: Path | str, *, timeout: float | None = None, label: str = ""
    ) -> AbstractAsyncContextManager[Any]: ...


def _lifecycle_service(app: App, module: str, name: str) -> Any:
    """A lifecycle service by class, without importing lifecycle internals at module import (the
    lifecycle feature may be absent in a partial build; then the caller falls back)."""
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    return app.find(cls)


@dataclass
class CycleResult:
    attempted: list[str] = field(default_factory=list)
    """Workspaces whose steps were attempted."""
    skipped: int = 0
    """Due workspaces skipped because another task is running them."""
    full: bool = False
    """The batch was full: more may be due right now."""
    next_due: float | None = None


class CleanupService:
    def __init__(
        self,
        app: App,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        teardown: TeardownFn | None = None,
        git: Git | None = None,
    ) -> None:
        self.app = app
        self.store = app.store
        self.config = app.config.cleanup
        self.clock: Clock = clock or SystemClock()
        self.backoff = Backoff(
            self.config.backoff_initial_s,
            self.config.backoff_max_s,
            self.config.backoff_jitter,
            rng or random.Random(),
        )
        self.obligations = Obligations(app.store)
        self.steps = Steps(
            self.obligations,
            trash_dir=app.paths.trash,
            git=git or app.find(Git) or Git(timeout_s=app.config.git_timeout_s),
            teardown=teardown or self._script_teardown,
            now=self.clock.time,
        )
        self._locks: dict[str, anyio.Lock] = {}
        self._local_dirs: dict[str, anyio.Lock] = {}
        self._cursor: dict[str, str | None] = {lane: None for lane in LANES}
        self._unannounced: list[str] = []
        self.poke: Callable[[str], None] = lambda lane: None
        """Set by the retry service: wake a lane (new work, or a blocker finished)."""

    # -- planning (inside the caller's transaction; no await) -------------------------------------

    def plan_checkout_removal(
        self,
        *,
        workspace_id: str,
        project_id: str,
        incarnation: str,
        runtime: str,
        repo_path: Path,
        checkout: Path,
        dev: int | None,
        ino: int | None,
        teardown: bool,
    ) -> list[str]:
        """Insert the ordered obligations (teardown?, trash, reclaim) for one checkout. Called
        inside the caller's `store.transaction()`, so the logical change and its obligations
        commit together; they are attempted only after that commit."""
        now = self.clock.time()
        row = self.store.one(
            "SELECT name, setup_status FROM workspaces WHERE id = ?", (workspace_id,)
        )
        admin = worktree_admin_dir(checkout) if runtime == "worktree" else None
        base = {"runtime": runtime, "repo": str(repo_path), "name": row["name"] if row else ""}
        seq = self.obligations.next_seq(workspace_id)
        planned: list[ObligationRow] = []

        def add(kind: str, detail: dict[str, Any], ob_id: str | None = None) -> str:
            ob = ObligationRow(
                id=ob_id or new_id(),
                workspace_id=workspace_id,
                project_id=project_id,
                kind=kind,
                seq=seq + len(planned),
                path=str(checkout),
                dev=dev,
                ino=ino,
                incarnation=incarnation,
                state=PENDING,
                attempts=0,
                next_attempt_at=now,
                last_error=None,
                reason=None,
                detail={**base, **detail},
                created_at=now,
                updated_at=now,
            )
            planned.append(ob)
            return ob.id

        with self.store.transaction():
            if teardown:
                # Whether setup ran decides what an untrusted config means at teardown time.
                add("teardown", {"setup_status": row["setup_status"] if row else None})
            trash_id = new_id()
            add(
                "trash",
                {
                    "trash_path": str(self.app.paths.trash / trash_id),
                    "admin_dir": str(admin) if admin else None,
                },
                trash_id,
            )
            add("reclaim", {"trash_ob": trash_id})
            for ob in planned:
                self.obligations.insert(ob)
        ids = [ob.id for ob in planned]
        self._unannounced.extend(ids)
        return ids

    # -- running -----------------------------------------------------------------------------------

    def _lock(self, workspace_id: str, lane: str) -> anyio.Lock:
        key = f"{lane}:{workspace_id}"
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = anyio.Lock()
        return lock

    async def run_workspace(
        self,
        workspace_id: str,
        *,
        force: bool = False,
        include_reclaim: bool = False,
        wait_s: float | None = None,
    ) -> CleanupStatus:
        """Attempt this workspace's due steps now, in order (each fenced), and return its status.
        Reclaim is left to the background lane unless `include_reclaim`."""
        self.flush_announcements()
        lanes = [PATH_LANE, RECLAIM_LANE] if include_reclaim else [PATH_LANE]
        for lane in lanes:
            lock = self._lock(workspace_id, lane)
            # Another task (the background lane, another request) may be running these very
            # steps: wait for it, bounded; if it takes longer, answer with the status as it is.
            acquired = False
            with anyio.move_on_after(wait_s if wait_s is not None else self.config.step_timeout_s):
                await lock.acquire()
                acquired = True
            if not acquired:
                continue
            try:
                await self._run_steps(workspace_id, lane, force=force)
            finally:
                lock.release()
        self.poke(RECLAIM_LANE)
        return self.status(workspace_id) or CleanupStatus(
            status="not_needed", reason="no cleanup obligations"
        )

    async def _run_steps(self, workspace_id: str, lane: str, *, force: bool) -> bool:
        """Run the workspace's pending steps of `lane` in order; stop at the first that is not
        due, blocked or failed. Returns True if a step was attempted."""
        kinds = LANES[lane]
        attempted = False
        for ob in self.obligations.pending_for_workspace(workspace_id):
            now = self.clock.time()
            if ob.kind not in kinds and lane == PATH_LANE:
                continue  # a reclaim is always its plan's last step: nothing here waits for it
            if ob.kind not in kinds:
                # An earlier step of the other lane is pending (reclaim waits for trash): this
                # lane's later steps are not due before it.
                self.obligations.defer_later_steps(
                    workspace_id, ob.seq, max(ob.next_attempt_at, now + self.backoff.initial_s)
                )
                break
            if not force and ob.next_attempt_at > now:
                self.obligations.defer_later_steps(workspace_id, ob.seq, ob.next_attempt_at)
                break
            blocker = self.obligations.blocking_teardown(ob) if ob.kind != "teardown" else None
            if blocker is not None:
                until = max(blocker.next_attempt_at, now + self.backoff.initial_s)
                self.obligations.defer([ob.id], until)
                self.obligations.defer_later_steps(workspace_id, ob.seq, until)
                log.info("cleanup.blocked", obligation=ob.id, by=blocker.id)
                break
            attempted = True
            stored = await self._attempt(ob)
            if stored.state == PENDING:
                self.obligations.defer_later_steps(workspace_id, ob.seq, stored.next_attempt_at)
                break
        return attempted

    async def _attempt(self, ob: ObligationRow) -> ObligationRow:
        started = time.monotonic()
        try:
            with anyio.fail_after(self.config.step_timeout_s):
                outcome = await self._run_step(ob)
        except TimeoutError:
            outcome = Outcome.failed(
                f"{ob.kind} did not finish within {self.config.step_timeout_s}s"
            )
        except XumError as exc:
            outcome = Outcome.failed(exc.message)
        except OSError as exc:
            outcome = Outcome.failed(f"{ob.kind}: {exc}")
        except Exception as exc:
            log.exception("cleanup.step_crashed", obligation=ob.id, kind=ob.kind)
            outcome = Outcome.failed(f"{ob.kind}: internal error: {exc!r}")
        return self._record(ob, outcome, time.monotonic() - started)

    async def _run_step(self, ob: ObligationRow) -> Outcome:
        if ob.kind == "reclaim":
            # The trash entry is the daemon's own: no workspace path is touched.
            return await self.steps.reclaim(ob)
        async with self._directory(ob.path, label=f"cleanup {ob.kind} {ob.id}"):
            if ob.kind == "teardown":
                return await self.steps.teardown(ob)
            if ob.kind in ("trash", "prune", "remove_dir"):
                return await self.steps.trash(ob)
        return Outcome.abandoned(f"unknown obligation kind {ob.kind!r}")

    def _directory(self, path: str, *, label: str) -> AbstractAsyncContextManager[Any]:
        coord = cast(
            "_DirectoryExclusion | None",
            _lifecycle_service(self.app, "xumd.lifecycle.coordinator", "Coordinator"),
        )
        if coord is not None:
            return coord.directory(path, label=label)
        return self._local_directory(path)

    @asynccontextmanager
    async def _local_directory(self, path: str) -> AsyncIterator[None]:
        # Only without the lifecycle feature (unit tests): the same rule, in-process.
        key = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        lock = self._local_dirs.setdefault(key, anyio.Lock())
        with anyio.fail_after(self.config.step_timeout_s):
            await lock.acquire()
        try:
            yield
        finally:
            lock.release()

    async def _script_teardown(self, ob: ObligationRow, cwd: Path) -> Outcome:
        """Run the project's teardown scripts (only a trusted config runs; see ScriptRunner)."""
        runner = _lifecycle_service(self.app, "xumd.lifecycle.scripts", "ScriptRunner")
        if runner is None:
            return Outcome.failed("no script runner is installed; teardown cannot run")
        ref = WorkspaceRef(
            id=ob.workspace_id,
            project_id=ob.project_id,
            name=str(ob.detail.get("name") or ob.workspace_id),
            path=cwd,
            incarnation=ob.incarnation,
        )
        result = await runner.run("teardown", project_id=ob.project_id, workspace=ref, cwd=cwd)
        if result.status == "untrusted" and ob.detail.get("setup_status") in SETUP_NEVER_RAN:
            # Setup never ran under a trusted config, so nothing of it needs tearing down:
            # blocking the deletion on a script the user never allowed would keep the checkout
            # forever. A config trusted at setup time and changed since still blocks (fail
            # closed): that setup's teardown is owed.
            return Outcome.done(
                teardown="skipped",
                reason="teardown not run: the project's config is not trusted and setup never "
                "ran under it",
            )
        error = result.error
        if getattr(result, "hint", None):
            error = f"{error} ({result.hint})"
        return steps_mod.teardown_outcome(result.status, error, result.output or "")

    def _record(self, ob: ObligationRow, outcome: Outcome, took_s: float) -> ObligationRow:
        now = self.clock.time()
        if outcome.state == COMPLETED:
            stored = self.obligations.complete(ob, now, outcome.detail)
            log.info("cleanup.completed", obligation=ob.id, kind=ob.kind, s=round(took_s, 3))
            # A finished teardown may unblock a sibling's deletion; a trash, its reclaim.
            self.poke(PATH_LANE)
            self.poke(RECLAIM_LANE)
        elif outcome.state == ABANDONED:
            stored = self.obligations.abandon(ob, now, outcome.reason or "abandoned")
            log.warning("cleanup.abandoned", obligation=ob.id, kind=ob.kind, reason=stored.reason)
            self.poke(PATH_LANE)
            self.poke(RECLAIM_LANE)
        else:
            delay = self.backoff.delay(ob.attempts + 1)
            stored = self.obligations.fail_attempt(ob, now, now + delay, outcome.error or "failed")
            log.warning(
                "cleanup.attempt_failed",
                obligation=ob.id,
                kind=ob.kind,
                attempts=stored.attempts,
                retry_in_s=round(delay, 3),
            )
        self._announce(stored)
        self._remember_status(ob.workspace_id)
        return stored

    def _announce(self, ob: ObligationRow) -> None:
        self.app.events.publish(OBLIGATION_EVENT, obligation=ob.model().model_dump(mode="json"))

    def flush_announcements(self) -> None:
        """Publish the creation of obligations planned in a transaction that has committed (a
        rolled-back plan left no row, and is not announced)."""
        ids, self._unannounced = self._unannounced, []
        for ob_id in ids:
            ob = self.obligations.get(ob_id)
            if ob is not None:
                self._announce(ob)

    def _remember_status(self, workspace_id: str) -> None:
        """Keep `workspaces.last_cleanup` current for workspace.get (the row, if any). Not a
        structural change: the row's version is not bumped."""
        status = self.status(workspace_id) if workspace_id else None
        if status is None:
            return
        with self.store.transaction():
            self.store.execute(
                "UPDATE workspaces SET last_cleanup = ? WHERE id = ?",
                (json.dumps(status.model_dump(mode="json")), workspace_id),
            )

    # -- the background cycle ---------------------------------------------------------------------

    async def run_cycle(self, lane: str, *, limit: int | None = None) -> CycleResult:
        """One bounded cycle: up to `batch_size` due workspaces, starting after the lane's
        rotating cursor (so a target that keeps failing cannot starve the others)."""
        self.flush_announcements()
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
            lock = self._lock(workspace_id, lane)
            if lock.locked():
                result.skipped += 1  # a request is running it now; it records the outcome
                continue
            async with lock:
                if await self._run_steps(workspace_id, lane, force=False):
                    result.attempted.append(workspace_id)
        result.next_due = self.obligations.next_due(kinds)
        return result

    def housekeeping(self) -> None:
        """At service start and now and then: bound future retries (a wall clock that jumped),
        forget old finished rows, and adopt trash entries no obligation names (a crash)."""
        now = self.clock.time()
        self.obligations.clamp_future(now + self.backoff.max_s)
        self.obligations.purge_finished(now - KEEP_COMPLETED_S, now - KEEP_ABANDONED_S)
        self._adopt_orphan_trash(now)

    def _adopt_orphan_trash(self, now: float) -> None:
        trash = self.app.paths.trash
        try:
            entries = list(os.scandir(trash))
        except FileNotFoundError:
            return
        known = self.obligations.referenced_trash_paths()
        for entry in entries:
            if entry.path in known or entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
                continue
            st = entry.stat(follow_symlinks=False)
            ob = ObligationRow(
                id=new_id(),
                workspace_id="",
                project_id="",
                kind="reclaim",
                seq=0,
                path=entry.path,
                dev=st.st_dev,
                ino=st.st_ino,
                incarnation="",
                state=PENDING,
                attempts=0,
                next_attempt_at=now,
                last_error=None,
                reason=None,
                detail={"trash_path": entry.path, "orphan": True},
                created_at=now,
                updated_at=now,
            )
            with self.store.transaction():
                self.obligations.insert(ob)
            log.info("cleanup.orphan_trash_adopted", obligation=ob.id, path=entry.path)
            self._unannounced.append(ob.id)

    # -- status -----------------------------------------------------------------------------------

    def status(self, workspace_id: str) -> CleanupStatus | None:
        """The latest cleanup status of a workspace (its latest incarnation's obligations)."""
        obs = self.obligations.for_workspace(workspace_id)
        if not obs:
            return None
        latest = max(obs, key=lambda o: (o.created_at, o.seq)).incarnation
        obs = [o for o in obs if o.incarnation == latest]
        path_obs = [o for o in obs if o.kind != "reclaim"]
        reclaim_obs = [o for o in obs if o.kind == "reclaim"]
        pending = [o for o in path_obs if o.state == PENDING]
        closed = [o for o in path_obs if o.state in (ABANDONED, FAILED)]
        if pending:
            with_error = [o for o in pending if o.last_error]
            status = CleanupStatus(
                status="pending",
                attempts=max(o.attempts for o in pending),
                next_attempt_at=min(o.next_attempt_at for o in pending),
                last_error=with_error[0].last_error if with_error else None,
            )
        elif closed:
            status = CleanupStatus(
                status="failed",
                attempts=max(o.attempts for o in closed),
                reason="; ".join(f"{o.kind}: {o.reason}" for o in closed),
                last_error=next((o.last_error for o in closed if o.last_error), None),
            )
        elif not path_obs:
            status = CleanupStatus(status="not_needed", reason="only a trash entry to reclaim")
        else:
            status = CleanupStatus(status="completed", attempts=max(o.attempts for o in path_obs))
        status.obligations = [o.id for o in obs if o.state == PENDING]
        if reclaim_obs:
            status.reclaim = _reclaim_status(reclaim_obs[-1])
        return status

    def summary(self) -> CleanupSummary:
        oldest = self.obligations.oldest_pending()
        return CleanupSummary(
            pending=self.obligations.count(PENDING),
            abandoned=self.obligations.count(ABANDONED),
            oldest=oldest.model() if oldest else None,
        )

    def require_known(self, *, obligation_id: str | None, workspace_id: str | None) -> str:
        """The workspace a retry scope names; unknown ids are errors, never a no-op."""
        if obligation_id is not None:
            _check_prefix(obligation_id, "ob_", "obligation")
            ob = self.obligations.get(obligation_id)
            if ob is None:
                raise XumError(
                    ErrorKind.NOT_FOUND,
                    f"cleanup obligation {obligation_id!r} not found",
                    id=obligation_id,
                )
            return ob.workspace_id
        assert workspace_id is not None
        _check_prefix(workspace_id, "ws_", "workspace")
        if not self.obligations.for_workspace(workspace_id):
            raise XumError(
                ErrorKind.NOT_FOUND,
                f"workspace {workspace_id!r} has no cleanup obligations",
                id=workspace_id,
            )
        return workspace_id


def _reclaim_status(ob: ObligationRow) -> ReclaimStatus:
    bytes_ = ob.detail.get("bytes")
    if ob.state == PENDING:
        return ReclaimStatus(status="pending")
    if ob.state == COMPLETED:
        needed = ob.detail.get("needed", True)
        return ReclaimStatus(
            status="completed" if needed else "not_needed",
            bytes=bytes_ if isinstance(bytes_, int) else None,
        )
    return ReclaimStatus(status="failed")


def _check_prefix(value: str, prefix: str, what: str) -> None:
    if not value.startswith(prefix):
        raise XumError(
            ErrorKind.INVALID_SCOPE,
            f"{value!r} is not a {what} id (a {what} id starts with {prefix!r})",
            id=value,
        )
