"""The warm pool's service: the claim a create makes, the background refill, the start-up
settling of every entry, and what gc and usage ask of the entries.

Sizes: `[create] pool = N` in a project's `.xum/config.toml`, else the root's `[create] pool`
(0: no pool). Entries are made at the project's base (the main checkout's HEAD commit), with its
cone; a claim takes only an entry at the create's own base commit and cone.

A claim never fails a create: an empty pool (`miss`), an entry at another commit or found
dirty, or any failure before the checkout became the workspace's (`stale`) leaves the create to
make a fresh checkout. Refill is one task for the daemon (so at most one entry is prepared per
project at a time), woken by a create and by a poll of each pooled project's base every
`POLL_S`; every git call it makes is bounded by git's own timeout; it stops at shutdown.

While a disk budget is set (`[gc]`), the refill makes an entry only when the budget holds with
it: the entry's estimate (the base's tree, as a create estimates it; nothing for a sparse
cone), plus the bytes creates in flight reserved, leaves `min_free_*` free on the pool's
filesystem, and the root's bytes (`RootBytes`, lifecycle/rootbytes.py) plus the entry stay
within `max_bytes`. Entries do not count toward `max_workspaces`: they are the daemon's head
start, no one's workspace, and a claim turns one into a workspace only through a create, which
is counted. An entry is never made by asking gc to make room: the refill only waits until
there is room. So when gc drops an entry to restore the budget, the refill does not write it
back while the budget lacks the room for it. A refill held back is logged once per episode
(`pool.refill_held_back`, then `pool.refill_resumed`) and shown in `daemon.status`'s budget
line (`held_back`); it is looked at again at each wake and poll.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio
from xum_protocol.models.checkout_extras import SparseInfo

from xumd.base import faults, logs
from xumd.base.config import GcConfig
from xumd.base.errors import XumError
from xumd.base.events import EventBus
from xumd.base.paths import RootPaths
from xumd.checkouts import marker
from xumd.lifecycle import bigrepo, capacity, createconfig, ids, rows, views
from xumd.lifecycle.capacity import MakeRoom
from xumd.lifecycle.pool import checkout, records, stamps
from xumd.lifecycle.pool.records import EntryRow
from xumd.lifecycle.rows import ProjectRow, WorkspaceRow
from xumd.store import Store
from xumd.system.git import Git

log = logs.get("xumd.lifecycle.pool")

REFILL_AFTER_INTENT = faults.declare(
    "pool.refill.after_intent", "a pool entry's row is committed `preparing`; nothing on disk"
)
REFILL_AFTER_CHECKOUT = faults.declare(
    "pool.refill.after_checkout", "a pool entry's checkout is made; its row is still `preparing`"
)
CLAIM_AFTER_INTENT = faults.declare(
    "pool.claim.after_intent", "a create marked a ready entry `claiming`; nothing moved"
)
CLAIM_AFTER_MOVE = faults.declare(
    "pool.claim.after_move",
    "the entry's checkout is at the workspace's path (git repaired); it carries the pool's marker",
)
CLAIM_AFTER_BRANCH = faults.declare(
    "pool.claim.after_branch",
    "the checkout carries the workspace's marker and its branch; the entry's row remains",
)

POLL_S = 30.0
"""How often the refill task looks at each pooled project's base when nothing woke it."""
CHECK_TIMEOUT_S = 5.0
"""A claim's `git status` of the entry: past this, the entry is stale (a fresh checkout)."""
RACY_S = 1.1
"""Git compares file and index timestamps to the second: how long after its checkout an
entry's index is written again, so that no file is racily clean (`PoolService._stamp`)."""
RETRY_S = 60.0
"""After a failed preparation, the project's refill waits this long (no busy loop)."""

Outcome = Literal["hit", "miss", "stale"]


@dataclass(slots=True)
class Claim:
    outcome: Outcome | None
    """None: no pool is configured for the project."""

    @property
    def hit(self) -> bool:
        return self.outcome == "hit"


@dataclass(frozen=True, slots=True)
class Surplus:
    """A pool entry gc may drop, and why."""

    entry_id: str
    project_id: str
    path: str
    why: str


def size(settings: createconfig.CreateSettings, root_default: int) -> int:
    return settings.pool if settings.pool is not None else root_default


class PoolService:
    def __init__(
        self,
        store: Store,
        git: Git,
        paths: RootPaths,
        events: EventBus,
        *,
        default_size: int,
        budget: GcConfig,
        room: MakeRoom,
    ) -> None:
        self.store = store
        self.budget = budget
        self.room = room
        """The root's bytes (`room.ledger`), measured through gc when there is no recent
        figure; never asked to make room for an entry."""
        self._held: dict[str, str] = {}
        self.git = git
        self.paths = paths
        self.events = events
        self.default_size = default_size
        self._wake = anyio.Event()
        self._scope: anyio.CancelScope | None = None
        self._stopped: anyio.Event | None = None
        self._failed_at: dict[str, float] = {}
        self._stamps: dict[str, stamps.Stamps] = {}

    # -- where entries live ----------------------------------------------------------------------

    def pool_dir(self, project: ProjectRow) -> Path:
        return checkout.pool_dir(views.workspaces_dir(self.paths.workspaces, project))

    def _same_filesystem(self, project: ProjectRow) -> str | None:
        """Why the project can have no pool here (None: it can): its entries must be renamed
        into the workspaces directory, so they live on that filesystem."""
        ws_dir = views.workspaces_dir(self.paths.workspaces, project)
        pool = checkout.pool_dir(ws_dir)
        try:
            ws_dir.mkdir(parents=True, exist_ok=True)
            pool.mkdir(exist_ok=True)
            if os.lstat(pool).st_dev != os.lstat(ws_dir).st_dev:
                return f"{pool} is on another filesystem than {ws_dir}"
        except OSError as exc:
            return f"cannot make {pool}: {exc.strerror}"
        return None

    def wanted(self, project: ProjectRow) -> int:
        if project.kind != "git":
            return 0
        try:
            return size(createconfig.load(project.path), self.default_size)
        except XumError:
            return 0  # a broken config refuses creates; the pool waits for it to be fixed

    def wake(self) -> None:
        self._wake.set()

    # -- the claim -------------------------------------------------------------------------------

    async def claim(
        self,
        project: ProjectRow,
        row: WorkspaceRow,
        *,
        pool_size: int,
        base: str,
        sparse: SparseInfo | None,
        new_branch: bool,
    ) -> Claim:
        """Under `row.path`'s directory exclusion, with nothing at the path: take a ready entry
        over as `row`'s checkout on its branch, or say why not (a fresh checkout follows)."""
        if pool_size <= 0:
            return Claim(None)
        # A claim (or a miss) is a reason to look at the pool, even after a failed refill: once
        # the claim is done, so that the refill's `worktree add` does not compete with it.
        self._failed_at.pop(project.id, None)
        try:
            return await self._claim(project, row, base=base, sparse=sparse, new_branch=new_branch)
        finally:
            self.wake()

    async def _claim(
        self,
        project: ProjectRow,
        row: WorkspaceRow,
        *,
        base: str,
        sparse: SparseInfo | None,
        new_branch: bool,
    ) -> Claim:
        if not new_branch or row.branch is None:
            return Claim("miss")  # an existing branch's checkout is no pool entry's
        cone = sparse.patterns if sparse is not None else None
        for _ in range(3):  # another create may take the entry between the read and the CAS
            entry = records.take_ready(self.store, project.id, base, cone)
            if entry is None:
                return Claim("stale" if records.any_ready(self.store, project.id) else "miss")
            with self.store.transaction():
                taken = records.mark_claiming(self.store, entry.id, row.id, row.path)
            if taken:
                return await self._take(project, row, entry)
        return Claim("miss")

    async def _take(self, project: ProjectRow, row: WorkspaceRow, entry: EntryRow) -> Claim:
        assert row.branch is not None
        moved = False
        try:
            CLAIM_AFTER_INTENT()
            stamped = self._stamps.pop(entry.id, None)
            admin = marker.worktree_admin_dir(entry.path)
            if admin is None or checkout.marker_at(entry.path) != checkout.of(entry):
                why: str | None = "its checkout does not carry its marker"
            elif stamped is not None:
                why = await stamps.check(
                    self.git,
                    entry.path,
                    admin,
                    stamped,
                    commit=entry.base_commit,
                    timeout_s=CHECK_TIMEOUT_S,
                )
            else:  # made before this start: the full status
                why = await checkout.check(self.git, entry.path, entry.base_commit, CHECK_TIMEOUT_S)
            if why is not None:
                log.info("pool.entry_stale", entry=entry.id, why=why)
                with self.store.transaction():
                    records.set_state(self.store, entry.id, records.STALE)
                return Claim("stale")
            moved = True
            admin = checkout.take_over(entry, row.path)
            CLAIM_AFTER_MOVE()
            checkout.write_workspace_marker(admin, marker.Marker(row.id, row.incarnation))
        except Exception as exc:
            # Not the workspace's yet: the pool's own checkout, with no one's work. Dropped;
            # the create goes on with a fresh checkout.
            log.warning("pool.claim_failed", entry=entry.id, error=repr(exc))
            with anyio.CancelScope(shield=True):
                await self._abandon(project, entry, row.path if moved else None)
            return Claim("stale")
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._abandon(project, entry, row.path if moved else None)
            raise
        try:
            await checkout.set_branch(self.git, row.path, row.branch, entry.base_commit)
            CLAIM_AFTER_BRANCH()
        finally:
            # The checkout is the workspace's from its marker on (the create's undo takes it
            # back as its own, when it fails); the entry's record ends here either way.
            with self.store.transaction():
                records.delete(self.store, entry.id)
        log.info("pool.claimed", entry=entry.id, workspace=row.id)
        return Claim("hit")

    async def _abandon(self, project: ProjectRow, entry: EntryRow, moved_to: Path | None) -> None:
        try:
            at = moved_to if moved_to is not None and os.path.lexists(moved_to) else None
            await checkout.drop(self.git, project.path, entry, at)
            if at is not None and os.path.lexists(entry.path):
                await checkout.drop(self.git, project.path, entry)
        finally:
            with self.store.transaction():
                records.delete(self.store, entry.id)

    # -- refill ----------------------------------------------------------------------------------

    async def serve(self) -> None:
        """The refill task (after readiness): each pooled project's stale entries dropped, its
        pool made up to its size at its base, one entry at a time; then wait for a wake or
        the poll."""
        self._stopped = anyio.Event()
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                while True:
                    self._wake = anyio.Event()
                    await self._drop_orphans()
                    for project in rows.list_projects(self.store):
                        try:
                            await self.refill(project)
                        except Exception as exc:  # one project's failure never ends the task
                            self._failed_at[project.id] = time.monotonic()
                            log.warning("pool.refill_failed", project=project.id, error=repr(exc))
                    with anyio.move_on_after(POLL_S):
                        await self._wake.wait()
        finally:
            self._stopped.set()

    async def stop(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
        if self._stopped is not None:
            with anyio.move_on_after(CHECK_TIMEOUT_S):
                await self._stopped.wait()

    async def _drop_orphans(self) -> None:
        """Entries of a removed project: nothing will claim them (`project.removed` wakes this)."""
        live = {p.id for p in rows.list_projects(self.store)}
        for entry in records.listed(self.store):
            if entry.project_id not in live and entry.state != records.CLAIMING:
                await self.drop_entry(entry.id)

    async def refill(self, project: ProjectRow) -> None:
        wanted = self.wanted(project)
        entries = records.listed(self.store, project.id)
        if wanted <= 0 and not entries:
            return
        failed = self._failed_at.get(project.id)
        if failed is not None and time.monotonic() - failed < RETRY_S:
            return
        base = await self._base(project)
        with self.store.transaction():
            if base is not None:
                records.mark_stale_except(self.store, project.id, base)
        for entry in self._surplus(project.id, wanted):
            await self.drop_entry(entry.id)
        if base is None or wanted <= 0:
            self._held.pop(project.id, None)  # no entry wanted: nothing held back
            return
        why = self._same_filesystem(project)
        if why is not None:
            log.warning("pool.unavailable", project=project.id, why=why)
            return
        while records.count_live(self.store, project.id) < wanted:
            sparse = await bigrepo.sparse_patterns(self.git, project.path)
            over = await self._over_budget(project, base, sparse)
            if over is not None:
                self._hold_back(project, over)
                return
            self._resume(project)
            await self._prepare_one(project, base, sparse)
        self._resume(project)

    async def _over_budget(
        self, project: ProjectRow, base: str, sparse: SparseInfo | None
    ) -> str | None:
        """Why one more entry would break the disk budget, or None."""
        config = self.budget
        if not capacity.sizes(config):  # `max_workspaces` counts workspaces, not entries
            return None
        size = 0
        if sparse is None:
            size = await capacity.tree_bytes(self.git, project.path, base) or 0
        pending = self.room.ledger.in_flight()
        short = capacity.shortfall(self.pool_dir(project), size + pending, config)
        if short is not None:
            return (
                f"{short.fs.describe()} has {short.free} bytes free; an entry of about {size}"
                + (f" (and {pending} reserved by creates)" if pending else "")
                + f" would leave less than [gc] min_free_* keeps ({short.keep})"
            )
        if not config.max_bytes:
            return None
        age = capacity.figure_age(config)
        if self.room.ledger.figure(age) is None:
            await self.room.measure_root()
        figure = self.room.ledger.figure(age)
        if figure is None:
            return "the root's bytes are not measured yet ([gc] max_bytes)"
        if figure.total + size > config.max_bytes:
            return (
                f"the root holds {figure.total} bytes ({figure.describe()}); an entry of about "
                f"{size} would cross [gc] max_bytes ({config.max_bytes})"
            )
        return None

    def _hold_back(self, project: ProjectRow, why: str) -> None:
        if project.id not in self._held:
            log.warning("pool.refill_held_back", project=project.id, why=why)
        self._held[project.id] = why

    def _resume(self, project: ProjectRow) -> None:
        if self._held.pop(project.id, None) is not None:
            log.info("pool.refill_resumed", project=project.id)

    def held_back(self) -> dict[str, str]:
        """The projects whose refill the disk budget holds back now, each with why."""
        live = {p.id for p in rows.list_projects(self.store)} if self._held else set()
        return {p: why for p, why in self._held.items() if p in live}

    def _surplus(self, project_id: str, wanted: int) -> list[EntryRow]:
        """Stale entries, and ready ones beyond the size (newest first: the oldest are claimed)."""
        entries = records.listed(self.store, project_id)
        stale = [e for e in entries if e.state == records.STALE]
        ready = [e for e in entries if e.state == records.READY]
        return stale + ready[max(0, wanted) :]

    async def _base(self, project: ProjectRow) -> str | None:
        result = await self.git.run(
            project.path, "rev-parse", "--verify", "--quiet", "HEAD^{commit}", check=False
        )
        text = result.output.text().strip()
        return text if result.ok and text else None

    async def _prepare_one(self, project: ProjectRow, base: str, sparse: SparseInfo | None) -> None:
        entry_id = ids.new_id(records.PREFIX)
        with self.store.transaction():
            records.insert_preparing(
                self.store,
                entry_id,
                project_id=project.id,
                path=self.pool_dir(project) / entry_id,
                incarnation=ids.new_incarnation(),
                base_commit=base,
                sparse=sparse.patterns if sparse is not None else None,
            )
        entry = records.get(self.store, entry_id)
        assert entry is not None
        try:
            REFILL_AFTER_INTENT()
            await checkout.prepare(self.git, project.path, entry, sparse)
            REFILL_AFTER_CHECKOUT()
            stamped = await self._stamp(entry)
            with self.store.transaction():
                records.mark_ready(self.store, entry_id)
            self._stamps[entry_id] = stamped
        except BaseException:
            # A half-made entry holds no one's work: taken back now (or by the start-up pass).
            with anyio.CancelScope(shield=True):
                await self._abandon(project, entry, None)
            raise
        ready = sum(1 for e in records.listed(self.store, project.id) if e.state == records.READY)
        log.info("pool.refilled", project=project.id, entry=entry_id, ready=ready)
        self.events.publish("pool.refilled", project_id=project.id, entry_id=entry_id, ready=ready)

    async def _stamp(self, entry: EntryRow) -> stamps.Stamps:
        """The made entry checked clean by `git status` (which also refreshes its index), then
        stamped, so that its claim needs no status of its own (lifecycle/pool/stamps.py).
        First its index is written again once the checkout's files are older than it by git's
        timestamp granularity: an entry written in the same second as its index is "racily
        clean", and the claim's `git diff-files` would read every such file."""
        await anyio.sleep(RACY_S)
        await self.git.run(
            entry.path,
            "update-index",
            "-q",
            "--refresh",
            "--force-write-index",
            what="git update-index --refresh (pool entry)",
        )
        why = await checkout.check(self.git, entry.path, entry.base_commit, CHECK_TIMEOUT_S * 12)
        admin = marker.worktree_admin_dir(entry.path)
        if why is not None or admin is None:
            raise RuntimeError(f"pool entry {entry.id} is not clean once made: {why}")
        return await anyio.to_thread.run_sync(stamps.take, entry.path, admin)

    # -- dropping (refill, gc) -------------------------------------------------------------------

    async def drop_entry(self, entry_id: str) -> bool:
        """Drop a stale or surplus entry (never one being claimed): its checkout (proven), then
        its row. False when it is not droppable now."""
        entry = records.get(self.store, entry_id)
        if entry is None or entry.state not in (records.STALE, records.READY):
            return False
        with self.store.transaction():
            records.set_state(self.store, entry.id, records.STALE)  # no claim takes it now
        self._stamps.pop(entry.id, None)
        project = rows.get_project(self.store, entry.project_id)
        gone = await checkout.drop(self.git, project.path if project else None, entry)
        if gone or not os.path.lexists(entry.path):
            with self.store.transaction():
                records.delete(self.store, entry.id)
        log.info("pool.entry_dropped", entry=entry.id, left=not gone)
        return gone

    def entries(self) -> list[EntryRow]:
        return records.listed(self.store)

    def surplus(self) -> list[Surplus]:
        """What gc collects: stale entries, entries beyond their project's size, entries of a
        project that is gone."""
        found: list[Surplus] = []
        projects = {p.id: p for p in rows.list_projects(self.store)}
        for project_id in sorted({e.project_id for e in records.listed(self.store)}):
            project = projects.get(project_id)
            wanted = self.wanted(project) if project is not None else 0
            for entry in self._surplus(project_id, wanted):
                if project is None:
                    why = "its project is gone"
                elif entry.state == records.STALE:
                    why = "stale: its base moved, or it was found changed"
                else:
                    why = f"beyond the pool's size ({wanted})"
                found.append(Surplus(entry.id, project_id, str(entry.path), why))
        return found

    # -- the start-up pass -----------------------------------------------------------------------

    async def reconcile(self) -> dict[str, int]:
        """Before the workspace pass (a start-up step of the lifecycle, installed before
        recovery's): every entry row agrees with the disk. A `preparing` or `stale` entry is
        dropped (proven by its marker); a `ready` one whose checkout is gone or not proven is
        forgotten; a `claiming` one is settled with the workspace it was going to: rolled
        forward when its checkout reached the workspace's path (the workspace's marker, its
        branch), back to `ready` when it never moved, dropped when its workspace is gone."""
        counts: dict[str, int] = {}
        for entry in records.listed(self.store):
            action = await self._settle(entry)
            counts[action] = counts.get(action, 0) + 1
            if action != "kept":
                log.warning("pool.entry_reconciled", entry=entry.id, action=action)
        return counts

    async def _settle(self, entry: EntryRow) -> str:
        project = rows.get_project(self.store, entry.project_id)
        repo = project.path if project is not None else None
        ready = entry.state == records.READY and project is not None
        if ready and checkout.marker_at(entry.path) == checkout.of(entry):
            return "kept"
        if entry.state == records.CLAIMING and project is not None:
            return await self._settle_claim(project, entry)
        await checkout.drop(self.git, repo, entry)
        with self.store.transaction():
            records.delete(self.store, entry.id)
        return "dropped"

    async def _settle_claim(self, project: ProjectRow, entry: EntryRow) -> str:
        if checkout.marker_at(entry.path) == checkout.of(entry):
            with self.store.transaction():
                records.set_state(self.store, entry.id, records.READY)
            return "unclaimed"
        ws = rows.get_workspace(self.store, entry.claimed_by or "")
        dest = entry.claim_path
        ours = ws is not None and ws.state == "creating" and dest is not None and ws.path == dest
        if ours and ws is not None and dest is not None:
            found = checkout.marker_at(dest)
            admin = marker.worktree_admin_dir(dest)
            if found == checkout.of(entry) and admin is not None:
                checkout.point_admin_at(admin, dest)
                checkout.write_workspace_marker(admin, marker.Marker(ws.id, ws.incarnation))
            if marker.read_worktree_marker(dest) == marker.Marker(ws.id, ws.incarnation):
                await self._ensure_branch(project, ws, dest, entry.base_commit)
                with self.store.transaction():
                    records.delete(self.store, entry.id)
                return "claim_completed"
        if (
            dest is not None
            and os.path.lexists(dest)
            and checkout.marker_at(dest) == checkout.of(entry)
        ):
            await checkout.drop(self.git, project.path, entry, dest)
        with self.store.transaction():
            records.delete(self.store, entry.id)
        return "dropped"

    async def _ensure_branch(
        self, project: ProjectRow, ws: WorkspaceRow, dest: Path, commit: str
    ) -> None:
        """The claim's branch step, done if it was not: HEAD on the workspace's branch, which is
        created at the entry's commit when missing (an existing branch elsewhere is not ours:
        HEAD stays detached, and the workspace pass flags the row)."""
        if ws.branch is None:
            return
        ref = f"refs/heads/{ws.branch}"
        head = await self.git.run(dest, "symbolic-ref", "-q", "HEAD", check=False)
        if head.ok and head.output.text().strip() == ref:
            return
        now = await self.git.run(project.path, "rev-parse", "--verify", "--quiet", ref, check=False)
        at = now.output.text().strip() if now.ok else None
        if at is None:
            try:
                await checkout.set_branch(self.git, dest, ws.branch, commit)
            except XumError:
                log.warning("pool.claim_branch_taken", workspace=ws.id, branch=ws.branch)
            return
        if at == commit:
            await self.git.run(dest, "symbolic-ref", "HEAD", ref, check=False)

    # -- usage -----------------------------------------------------------------------------------

    def entry_paths(self) -> list[Path]:
        """For `workspace.usage`: every entry's checkout (a claiming one is the workspace's
        by now or soon: counted there)."""
        return [e.path for e in records.listed(self.store) if e.state != records.CLAIMING]
