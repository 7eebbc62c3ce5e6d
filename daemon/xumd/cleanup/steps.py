"""The physical steps: teardown, trash (rename into the trash area + drop git's admin entry), and
reclaim (delete the trash entry). Each returns an `Outcome`; the service records it.

Durable order inside a step: whatever a replay needs (the trash path) is in the obligation row
before the effect; every step is idempotent on replay (a trash step finding the path empty and the
directory in the trash completes; a reclaim finding the entry gone completes).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio

from xumd.base import faults, logs
from xumd.checkouts.adminfile import read_admin_file
from xumd.checkouts.marker import parse as parse_marker
from xumd.cleanup import fence, trash_area
from xumd.cleanup.obligations import ABANDONED, ObligationRow, Obligations
from xumd.system import fsdelete
from xumd.system.fsdelete import Interrupted, delete_tree
from xumd.system.git import Git

log = logs.get("xumd.cleanup.steps")

AFTER_TEARDOWN = faults.declare(
    "cleanup.teardown.after_run", "teardown ran; its completion is not committed yet"
)
BEFORE_TRASH = faults.declare("cleanup.trash.before_rename", "trash path committed; not moved yet")
AFTER_TRASH = faults.declare(
    "cleanup.trash.after_rename", "checkout moved into the trash; git admin entry still there"
)
HOLD_BEFORE_RENAME = faults.declare(
    "cleanup.trash.hold_before_rename",
    "fenced, not moved yet: the window a swap at the path can use (the move re-checks)",
    simulate=True,
)
AFTER_RECLAIM = faults.declare(
    "cleanup.reclaim.after_delete", "trash entry deleted; completion not committed yet"
)

TRASH_HOLD = faults.declare(
    "cleanup.trash.hold",
    "simulate: hold a trash step before its fence, its look for mounts and the move of the "
    "checkout, until the test releases it (faults.FaultPoint.hold)",
    simulate=True,
)
RECLAIM_HOLD = faults.declare(
    "cleanup.reclaim.hold",
    "simulate: hold a reclaim before it looks at its trash entry, until the test releases it",
    simulate=True,
)
RECLAIM_WALK_HOLD = faults.declare(
    "cleanup.reclaim.hold_walk",
    "simulate: hold a reclaim after its checks (mount table, identity), just before the "
    "deleting walk, until the test releases it",
    simulate=True,
)

TAIL_CHARS = 1500
"""How much of a failing teardown's output (its diagnostic tail) goes into last_error."""


@dataclass(frozen=True, slots=True)
class Outcome:
    state: str  # completed | failed | abandoned
    error: str | None = None
    reason: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def done(**detail: Any) -> Outcome:
        return Outcome("completed", detail=detail)

    @staticmethod
    def failed(error: str) -> Outcome:
        return Outcome("failed", error=error)

    @staticmethod
    def abandoned(reason: str) -> Outcome:
        return Outcome("abandoned", reason=reason)


TeardownFn = Callable[[ObligationRow, Path], Awaitable[Outcome]]
"""Run the teardown of `ob` in the checkout; the default runs the project's teardown scripts
through the runner the composition root hands in (teardown_scripts.py)."""


class UnsavedWork(Protocol):
    """What a lingering archived checkout holds that its archive does not: the comparison
    unarchive refuses on, implemented by the lifecycle (cleanup does not import it) and handed
    in by the composition root. Required: its answer decides whether a checkout may be moved
    into the trash, so there is no stand-in that would answer "nothing would be lost"."""

    async def unsaved_files(self, ob: ObligationRow) -> list[str]:
        """The files of `ob`'s checkout that its archive does not hold (empty: nothing would be
        lost). Raises when it cannot tell; the trash step then waits."""
        ...


UNSAVED_SHOWN = 10
"""How many of the unsaved files last_error names (the rest are counted)."""


class Steps:
    def __init__(
        self,
        obligations: Obligations,
        *,
        trash_dir: Path,
        git: Git,
        teardown: TeardownFn,
        unsaved: UnsavedWork,
        records: fence.WorkspaceRecords,
        now: Callable[[], float],
    ) -> None:
        self.obligations = obligations
        self.trash_dir = trash_dir
        self.git = git
        self.teardown_fn = teardown
        self.now = now
        self.unsaved = unsaved
        self.records = records

    # -- fences ----------------------------------------------------------------------------------

    def _fence(self, ob: ObligationRow) -> tuple[fence.DirCheck, fence.RowProblem | None]:
        """(directory check, store problem), read now: the caller holds the directory exclusion."""
        problem = fence.row_problem(self.records, ob)
        markers = fence.accepted_markers(self.obligations.siblings(ob), ob)
        return fence.check_directory(Path(ob.path), ob.identity, markers), problem

    # -- teardown --------------------------------------------------------------------------------

    async def teardown(self, ob: ObligationRow) -> Outcome:
        check, problem = self._fence(ob)
        if problem:
            return _refused(problem)
        if not check.present:
            return Outcome.abandoned("the checkout directory is gone; teardown was not run")
        if check.problem:
            over = _mount_over(Path(ob.path))
            if over:
                # A mount over the checkout hides it (and its marker): wait, do not abandon.
                return Outcome.failed(f"waiting: mount at {over} over the checkout")
            return Outcome.abandoned(check.problem)
        outcome = await self.teardown_fn(ob, Path(ob.path))
        AFTER_TEARDOWN()
        return outcome

    # -- trash -----------------------------------------------------------------------------------

    def _trash_path(self, ob: ObligationRow) -> tuple[Path, ObligationRow]:
        """The trash path, on the checkout's mount, committed before anything moves."""
        # Not mutated: planning records trash_dir / ob.id: both operands are equal.
        planned = Path(ob.detail.get("trash_path") or self.trash_dir / ob.id)  # pragma: no mutate
        planned.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not fsdelete.same_mount(planned.parent, Path(ob.path)):
            # A rename cannot cross mounts (EXDEV; two bind mounts of one filesystem share
            # st_dev but not a mount): use a trash area next to the checkout instead (still
            # instant, still outside the path the user sees).
            alt_dir = Path(ob.path).parent / ".xum-trash"
            alt_dir.mkdir(mode=0o700, exist_ok=True)
            planned = alt_dir / ob.id
        if str(planned) != ob.detail.get("trash_path"):
            ob = self.obligations.set_detail(ob, self.now(), {"trash_path": str(planned)})
        return planned, ob

    async def trash(self, ob: ObligationRow) -> Outcome:
        await TRASH_HOLD.hold()
        check, problem = self._fence(ob)
        path = Path(ob.path)
        moved = False
        trash_mount: list[object] | None = None
        trash_path = Path(ob.detail["trash_path"]) if ob.detail.get("trash_path") else None
        if problem and not problem.final:
            return _refused(problem)
        if check.present:
            if problem:
                return _refused(problem)
            # Before the directory check: a mount over the checkout hides its marker (the fence
            # would call it foreign and abandon for good), and one inside would ride along into
            # the trash (its reclaim would have to stop at it). Wait until they are unmounted.
            mounts = [] if os.path.islink(path) else fsdelete.mounts_at_or_under(path)
            if mounts:
                return Outcome.failed(
                    f"waiting: mount at {fsdelete.describe_mounts(mounts)} in or over the "
                    "checkout; the checkout is left in place until it is unmounted"
                )
            if check.problem:
                return Outcome.abandoned(check.problem)
            # An archived checkout that lingered (a teardown failed, a mount) may have gained
            # work since its archive: trashing it would lose that work. Wait for the user.
            files = await self.unsaved.unsaved_files(ob)
            if files:
                return Outcome.failed(_unsaved_wait(path, files))
            trash_path, ob = self._trash_path(ob)
            if os.path.lexists(trash_path):
                return Outcome.failed(f"trash entry {trash_path} already exists; not overwritten")
            BEFORE_TRASH()
            await HOLD_BEFORE_RENAME.hold()
            os.rename(path, trash_path)
            moved = True
            # The rename moved whatever sat at the path at that instant: prove it was the
            # fenced directory, or put it back and leave it alone.
            st = os.lstat(trash_path)
            if ob.identity is not None and (st.st_dev, st.st_ino) != ob.identity:
                os.rename(trash_path, path)
                return Outcome.abandoned(f"{fence.FOREIGN} (swapped during the move)")
            AFTER_TRASH()
            log.info("cleanup.trashed", obligation=ob.id, path=str(path), trash=str(trash_path))
            # Which mount the entry went onto: a mount over the area later hides it, and its
            # reclaim must not take "not there" for "gone" (trash_area.py).
            area = trash_area.area_mount(trash_path.parent)
            if area is not None:
                trash_mount = area
        elif trash_path is not None and self._is_ours(trash_path, ob):
            moved = True  # a replay after a crash between the rename and the commit
            trash_mount = trash_area.area_mount(trash_path.parent)
        if ob.detail.get("runtime") == "worktree":
            dropped = await self._drop_admin_entry(ob)
        else:
            dropped = None
        detail: dict[str, Any] = {"moved": moved, "admin_entry": dropped}
        if trash_mount is not None:
            detail["trash_mount"] = trash_mount
        if trash_path is not None:
            # The recorder completes the row it was handed, whose detail predates
            # `_trash_path`: without this, a trash area next to the checkout (another mount)
            # was forgotten and its reclaim looked for the entry in ROOT/trash.
            detail["trash_path"] = str(trash_path)
        if not moved:
            detail["note"] = "the checkout was already gone"
        return Outcome.done(**detail)

    def _is_ours(self, trash_path: Path, ob: ObligationRow) -> bool:
        try:
            st = os.lstat(trash_path)
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and (
            ob.identity is None or (st.st_dev, st.st_ino) == ob.identity
        )

    async def _drop_admin_entry(self, ob: ObligationRow) -> str:
        """Drop git's admin entry of this worktree (`<common>/worktrees/<name>`), only when it is
        provably ours: its `locked` reason carries our marker, or it is unlocked and still points
        at our (now empty) path. xum locks its worktrees, so `git worktree prune` would skip the
        entry until unlocked; and pruning would touch other worktrees' entries too. Removing this
        one directory is exactly what prune does for it, and nothing else."""
        admin_text = ob.detail.get("admin_dir")
        repo = ob.detail.get("repo")
        if not admin_text or not repo:
            return "unknown"
        admin = Path(admin_text)
        async with self.git.admin_lock(Path(repo)):
            try:
                st = os.lstat(admin)
            except FileNotFoundError:
                return "already gone"
            if not stat.S_ISDIR(st.st_mode) or admin.parent.name != "worktrees":
                return "left alone (not a worktree admin dir)"
            locked = read_admin_file(admin / "locked")
            gitdir = read_admin_file(admin / "gitdir")
            ours = False
            if locked is not None:
                found = parse_marker(locked)
                ours = found is not None and (found.workspace_id, found.incarnation) == (
                    ob.workspace_id,
                    ob.incarnation,
                )
            elif gitdir is not None:
                target = Path(gitdir.strip())
                ours = target == Path(ob.path) / ".git" and not os.path.lexists(target)
            if not ours:
                return "left alone (names another worktree)"
            left = (await anyio.to_thread.run_sync(delete_tree, admin)).left
            if left:
                log.warning(
                    "cleanup.admin_entry_left",
                    obligation=ob.id,
                    left=left[:5],  # pragma: no mutate (log text only)
                )
                return f"left alone (mount at {fsdelete.describe_mounts(left)})"
            log.info("cleanup.admin_entry_dropped", obligation=ob.id, admin=str(admin))
            return "dropped"

    # -- reclaim ---------------------------------------------------------------------------------

    def reclaim_source(self, ob: ObligationRow) -> tuple[Path | None, str | None]:
        """(trash entry to delete, abandon reason); usage counts the pending ones by it too."""
        if ob.detail.get("trash_path"):
            return Path(ob.detail["trash_path"]), None
        trash_ob = self.obligations.get(str(ob.detail.get("trash_ob", "")))
        if trash_ob is None:
            return None, "its trash step is unknown"
        if trash_ob.state == ABANDONED:
            return None, "its trash step was abandoned; nothing was moved to the trash"
        if not trash_ob.detail.get("moved"):
            return None, None
        return Path(trash_ob.detail["trash_path"]), None

    def _trash_mount(self, ob: ObligationRow) -> object:
        """The mount the entry was put on (trash_area.area_mount), as its trash step (or the
        orphan adoption) recorded it; None when unknown."""
        if "trash_mount" in ob.detail:
            return ob.detail["trash_mount"]
        trash_ob = self.obligations.get(str(ob.detail.get("trash_ob", "")))
        return trash_ob.detail.get("trash_mount") if trash_ob is not None else None

    async def reclaim(self, ob: ObligationRow) -> Outcome:
        source, reason = self.reclaim_source(ob)
        if reason:
            return Outcome.abandoned(reason)
        if source is None:
            return Outcome.done(bytes=0, needed=False)
        await RECLAIM_HOLD.hold()
        try:
            st = os.lstat(source)
        except FileNotFoundError:
            over = trash_area.hiding_mount(source, self._trash_mount(ob))
            if over is not None:
                # Hidden, not gone: the space is still used; saying done would be false.
                return Outcome.failed(
                    f"waiting: mount at {over} over the trash area hides trash entry {source}; "
                    "it is not known to be gone (unmount it and the reclaim completes)"
                )
            return Outcome.done(bytes=int(ob.detail.get("bytes") or 0))
        if not stat.S_ISDIR(st.st_mode):
            return Outcome.abandoned(f"trash entry {source} is not a directory; left alone")
        # A mount that appeared in the trash entry (or over it) is never descended: the reclaim
        # stays pending naming it. Checked before the walk (nothing is deleted then), and by
        # the walk itself for one that appears meanwhile (it stops at every mount boundary).
        mounts = fsdelete.mounts_at_or_under(source)
        if mounts:
            return Outcome.failed(_mount_wait(source, mounts))
        if ob.identity is not None and (st.st_dev, st.st_ino) != ob.identity:
            return Outcome.abandoned(f"trash entry {source} is not the directory moved there")
        await RECLAIM_WALK_HOLD.hold()
        stop = threading.Event()
        try:
            report = await anyio.to_thread.run_sync(
                delete_tree, source, stop, abandon_on_cancel=True
            )
        except Interrupted:
            return Outcome.failed("interrupted")
        # Not mutated: the runner's own `except OSError` records the same failure.
        except OSError as exc:  # pragma: no mutate
            return Outcome.failed(f"deleting {source}: {exc}")
        finally:
            # Cancelled (shutdown): the worker stops at its next entry.
            stop.set()
        if report.left:
            # Not in the mount table a moment ago: a mount that appeared since, or a directory
            # on another device without a mount of its own (a btrfs subvolume): left alone.
            log.warning(
                "cleanup.reclaim_left",
                obligation=ob.id,
                left=report.left[:5],  # pragma: no mutate (log text only)
            )
            return Outcome.failed(
                f"waiting: mount or other device at {fsdelete.describe_mounts(report.left)} "
                f"inside trash entry {source}; not descended (unmount it and the reclaim "
                "completes)"
            )
        AFTER_RECLAIM()
        log.info("cleanup.reclaimed", obligation=ob.id, bytes=report.freed)
        return Outcome.done(bytes=report.freed, needed=True)


def _mount_over(path: Path) -> str | None:
    """The mount point sitting on `path` itself (not followed if `path` is a symlink)."""
    if os.path.islink(path):
        return None
    real = os.path.realpath(path)
    return real if real in fsdelete.mounts_at_or_under(path) else None


def _mount_wait(source: Path, mounts: list[str]) -> str:
    return (
        f"waiting: mount at {fsdelete.describe_mounts(mounts)} inside trash entry {source}; "
        "not descended (unmount it and the reclaim completes)"
    )


def _unsaved_wait(path: Path, files: list[str]) -> str:
    shown = ", ".join(files[:UNSAVED_SHOWN])
    more = f" and {len(files) - UNSAVED_SHOWN} more" if len(files) > UNSAVED_SHOWN else ""
    return (
        f"waiting: the archived checkout at {path} has work its archive does not hold: "
        f"{shown}{more}; it is left in place. Move those files away (or delete them) and "
        "run cleanup.retry, or unarchive the workspace (it refuses until they are moved), "
        "or workspace.remove to discard them"
    )


def _refused(problem: fence.RowProblem) -> Outcome:
    if problem.final:
        return Outcome.abandoned(problem.reason)
    return Outcome.failed(f"waiting: {problem.reason}")


def teardown_outcome(status: str, error: str | None, output: str) -> Outcome:
    """Map a ScriptOutcome to a step outcome; a failure keeps the output's diagnostic tail."""
    if status in ("ok", "none"):
        return Outcome.done(teardown=status)
    head = error or f"teardown {status}"
    tail = output[-TAIL_CHARS:].strip() if output else ""
    return Outcome.failed(f"{head}\n{tail}" if tail else head)
