"""The workspace service: create, archive, unarchive, remove, rename, keep.

Every structural operation runs under `coord.exclusive(...)` (admission closed, holders drained,
row resolved under the reservation) and follows the durable order of design section 6:
intent committed -> fault point -> effect on disk -> fault point -> completion committed.
Each effect is idempotent or detectable on replay (the row's state and incarnation, the on-disk
marker, the rename journal), which is what the startup recovery pass relies on.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.cleanup import CleanupStatus
from xum_protocol.models.workspace import (
    DroppedInfo,
    RestoredInfo,
    ScriptResult,
    SnapshotInfo,
    WorkspaceArchiveResult,
    WorkspaceCreateParams,
    WorkspaceCreateResult,
    WorkspaceInfo,
    WorkspaceRemoveResult,
    WorkspaceRenameResult,
    WorkspaceResult,
    WorkspaceUnarchiveResult,
)

from xumd import faults, logs
from xumd.cleanup.service import CleanupService
from xumd.errors import XumError
from xumd.git import Git
from xumd.lifecycle import gitlocks, ids, marker, rows, views
from xumd.lifecycle.coordinator import Coordinator
from xumd.lifecycle.rows import ProjectRow, WorkspaceRow
from xumd.lifecycle.scripts import ScriptOutcome, ScriptRunner, preserve_globs
from xumd.lifecycle.seams import LifecycleHooks, busy_message
from xumd.lifecycle.snapshot import Dropped, Snapshot, Snapshotter

if TYPE_CHECKING:
    from xumd.app import App

log = logs.get("xumd.lifecycle.service")

CREATE_AFTER_INTENT = faults.declare("workspace.create.after_intent")
CREATE_AFTER_CHECKOUT = faults.declare("workspace.create.after_checkout")
CREATE_AFTER_SETUP = faults.declare("workspace.create.after_setup")
ARCHIVE_AFTER_INTENT = faults.declare("workspace.archive.after_intent")
ARCHIVE_AFTER_SNAPSHOT = faults.declare("workspace.archive.after_snapshot")
ARCHIVE_AFTER_COMMIT = faults.declare("workspace.archive.after_commit")
UNARCHIVE_AFTER_INTENT = faults.declare("workspace.unarchive.after_intent")
UNARCHIVE_AFTER_CHECKOUT = faults.declare("workspace.unarchive.after_checkout")
UNARCHIVE_AFTER_RESTORE = faults.declare("workspace.unarchive.after_restore")
UNARCHIVE_AFTER_SETUP = faults.declare("workspace.unarchive.after_setup")
SETUP_AFTER_INTENT = faults.declare(
    "workspace.setup.after_intent", "setup_status=running committed; the script has not run"
)
REMOVE_AFTER_INTENT = faults.declare("workspace.remove.after_intent")
REMOVE_AFTER_SNAPSHOT = faults.declare("workspace.remove.after_snapshot")
REMOVE_AFTER_COMMIT = faults.declare("workspace.remove.after_commit")
RENAME_AFTER_JOURNAL = faults.declare("workspace.rename.after_journal")
RENAME_AFTER_MOVE = faults.declare("workspace.rename.after_move")
RENAME_AFTER_BRANCH = faults.declare("workspace.rename.after_branch")

UNDO_DEADLINE_S = 60.0


@dataclass(frozen=True, slots=True)
class IntentBinding:
    """A delegated turn's binding, written by the daemon in the target's intent transaction
    (never from client params): `record(workspace_id)` runs inside that same transaction."""

    handle_id: str
    owner_workspace_id: str
    record: Callable[[str], None]


def _err(kind: ErrorKind, message: str, **data: Any) -> XumError:
    return XumError(kind, message, **data)


def _some(files: list[str], most: int = 20) -> str:
    """A bounded list of paths for an error message."""
    more = f" and {len(files) - most} more" if len(files) > most else ""
    return ", ".join(files[:most]) + more


class WorkspaceService:
    def __init__(
        self,
        app: App,
        coord: Coordinator,
        git: Git,
        scripts: ScriptRunner,
        snapshots: Snapshotter,
    ) -> None:
        self.app = app
        self.store = app.store
        self.coord = coord
        self.git = git
        self.scripts = scripts
        self.snapshots = snapshots

    # -- helpers -------------------------------------------------------------------------------

    @property
    def cleanup(self) -> CleanupService:
        # Looked up when used: the cleanup feature is installed after this one.
        return self.app.get(CleanupService)

    def _hooks(self) -> LifecycleHooks:
        return self.app.find(LifecycleHooks) or LifecycleHooks()

    def info(self, row: WorkspaceRow) -> WorkspaceInfo:
        return views.workspace_info(row, self.cleanup.status)

    def publish(self, event: str, row: WorkspaceRow, **extra: Any) -> None:
        self.app.events.publish(event, workspace=self.info(row).model_dump(mode="json"), **extra)

    def project(self, project_id: str) -> ProjectRow:
        ids.check_id(project_id, ids.PROJECT, "project")
        project = rows.get_project(self.store, project_id)
        if project is None:
            raise _err(ErrorKind.NOT_FOUND, f"project {project_id!r} not found", id=project_id)
        return project

    def row(self, workspace_id: str) -> WorkspaceRow:
        ids.check_id(workspace_id, ids.WORKSPACE, "workspace")
        row = rows.get_workspace(self.store, workspace_id)
        if row is None:
            raise _err(
                ErrorKind.NOT_FOUND, f"workspace {workspace_id!r} not found", id=workspace_id
            )
        return row

    def path_for(self, project: ProjectRow, name: str) -> Path:
        return views.workspaces_dir(self.app.paths.workspaces, project) / name

    def _update(self, row: WorkspaceRow, **fields: Any) -> WorkspaceRow:
        """CAS on the incarnation the caller resolved; a mismatch is a lost race, not success."""
        new = rows.update_workspace(
            self.store, row.id, expect_incarnation=row.incarnation, **fields
        )
        if new is None:
            raise _err(
                ErrorKind.NOT_FOUND,
                f"workspace {row.id!r} changed or vanished during the operation",
                id=row.id,
            )
        return new

    def _owns_checkout(self, row: WorkspaceRow) -> bool:
        """The path exists and carries this row's marker (and identity, when recorded)."""
        if not row.path.is_dir():
            return False
        found = marker.read_marker(row.path)
        if found is None or (found.workspace_id, found.incarnation) != (row.id, row.incarnation):
            return False
        if row.ino is not None:
            st = row.path.stat()
            return (st.st_dev, st.st_ino) == (row.dev, row.ino)
        return True

    async def _quiescent(self, row: WorkspaceRow, op: str) -> None:
        holders = await self._hooks().holders(row.ref())
        if holders:
            raise _err(
                ErrorKind.BUSY,
                f"cannot {op} {row.name!r}: " + busy_message(holders),
                holders=[h.as_dict() for h in holders],
            )

    async def _clear_stale_locks(self, repo: Path) -> list[str]:
        """Under the repo's admin lock: clear provably stale git lock files, report them."""
        common = await self.git.out(repo, "rev-parse", "--path-format=absolute", "--git-common-dir")
        report = gitlocks.clear_stale(Path(common))
        return report.cleared

    @asynccontextmanager
    async def _directories(self, *paths: Path) -> AsyncIterator[None]:
        """Directory exclusion for several paths, always taken in one order (no deadlock)."""
        async with AsyncExitStack() as stack:
            for path in sorted({os.path.realpath(p) for p in paths}):
                await stack.enter_async_context(self.coord.directory(path))
            yield

    def _script_fields(self, outcome: ScriptOutcome) -> dict[str, Any]:
        detail = outcome.as_dict()
        detail.pop("status")
        return {"setup_status": outcome.status, "setup_output": json.dumps(detail)}

    async def _setup(self, row: WorkspaceRow) -> tuple[WorkspaceRow, ScriptOutcome]:
        with self.store.transaction():
            row = self._update(row, setup_status="running", setup_output=None)
        self.publish("workspace.updated", row)
        SETUP_AFTER_INTENT()
        try:
            outcome = await self.scripts.run(
                "setup", project_id=row.project_id, workspace=row.ref(), cwd=row.path
            )
        except Exception as exc:  # a setup that cannot even start is reported, not raised
            log.exception("workspace.setup_crashed", workspace=row.id)
            outcome = ScriptOutcome(status="failed", error=f"setup could not run: {exc}")
        return row, outcome

    def _status_of(self, outcome: ScriptOutcome) -> ScriptResult:
        return ScriptResult.model_validate(outcome.as_dict())

    # -- create ----------------------------------------------------------------------------------

    async def create(
        self, params: WorkspaceCreateParams, binding: IntentBinding | None = None
    ) -> WorkspaceCreateResult:
        project = self.project(params.project_id)
        ids.check_name(params.name)
        async with self.coord.project_shared(project.id, label=f"create {params.name}"):
            project = self.project(params.project_id)
            return await self._create(project, params, binding)

    async def _create(
        self,
        project: ProjectRow,
        params: WorkspaceCreateParams,
        binding: IntentBinding | None = None,
    ) -> WorkspaceCreateResult:
        name = params.name
        runtime = params.runtime
        if runtime == "worktree" and project.kind != "git":
            raise _err(
                ErrorKind.INVALID_PARAMS,
                f"project {project.name!r} is not a git repository; use runtime 'directory'",
            )
        if runtime == "directory" and (params.branch or params.base):
            raise _err(ErrorKind.INVALID_PARAMS, "runtime 'directory' takes no branch or base")
        existing = rows.workspace_by_name(self.store, project.id, name)
        if existing is not None:
            raise _err(
                ErrorKind.CONFLICT,
                f"project {project.name!r} already has a workspace {name!r} ({existing.id})",
                id=existing.id,
            )
        path = self.path_for(project, name)
        branch: str | None = None
        base: str | None = None
        create_branch = False
        if runtime == "worktree":
            branch, base, create_branch = await self._plan_branch(project, name, params)
        workspace_id = ids.new_id(ids.WORKSPACE)
        incarnation = ids.new_incarnation()
        now = time.time()
        try:
            with self.store.transaction():
                self.store.execute(
                    "INSERT INTO workspaces (id, project_id, name, runtime, path, branch, base,"
                    " branch_created, state, incarnation, setup_status, created_at, updated_at,"
                    " auto_archive, handle_id, owner_workspace_id)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'creating', ?, 'pending', ?, ?, ?, ?, ?)",
                    (
                        workspace_id,
                        project.id,
                        name,
                        runtime,
                        str(path),
                        branch,
                        base,
                        int(create_branch),
                        incarnation,
                        now,
                        now,
                        params.auto_archive,
                        binding.handle_id if binding else None,
                        binding.owner_workspace_id if binding else None,
                    ),
                )
                if binding is not None:
                    binding.record(workspace_id)
        except sqlite3.IntegrityError:
            raise _err(
                ErrorKind.CONFLICT, f"project {project.name!r} already has a workspace {name!r}"
            ) from None
        row = self.row(workspace_id)
        self.publish("workspace.created", row)
        CREATE_AFTER_INTENT()
        cleared: list[str] = []
        made = False
        try:
            async with self.coord.directory(path, label=f"create {workspace_id}"):
                # Revalidate after the wait: the row is still ours, and nothing is at the path
                # (a cleanup that held the directory may just have emptied it, or not).
                row = self.row(workspace_id)
                if os.path.lexists(path):
                    raise _err(
                        ErrorKind.CONFLICT,
                        f"{path} already exists; choose another name",
                        path=str(path),
                    )
                path.parent.mkdir(parents=True, exist_ok=True)
                made = True
                if runtime == "worktree":
                    assert branch is not None and base is not None
                    cleared = await self._worktree_add(
                        project.path, row, branch, base if create_branch else None
                    )
                else:
                    path.mkdir()
                    marker.write_directory_marker(path, marker.Marker(workspace_id, incarnation))
            CREATE_AFTER_CHECKOUT()
            st = path.stat()
            with self.store.transaction():
                row = self._update(row, dev=st.st_dev, ino=st.st_ino)
            row, outcome = await self._setup(row)
            CREATE_AFTER_SETUP()
            with self.store.transaction():
                row = self._update(row, state="active", **self._script_fields(outcome))
        except BaseException as exc:
            with anyio.CancelScope(shield=True), anyio.move_on_after(UNDO_DEADLINE_S):
                await self._undo_create(project, row, made, create_branch, exc)
            raise
        self.publish("workspace.state_changed", row)
        log.info("workspace.created", workspace=row.id, project=project.id, path=str(path))
        return WorkspaceCreateResult(
            workspace=self.info(row), setup=self._status_of(outcome), cleared_locks=cleared
        )

    async def _plan_branch(
        self, project: ProjectRow, name: str, params: WorkspaceCreateParams
    ) -> tuple[str, str, bool]:
        branch = params.branch or f"xum/{name}"
        check = await self.git.run(
            project.path, "check-ref-format", "--branch", branch, check=False
        )
        if not check.ok:
            raise _err(ErrorKind.INVALID_NAME, f"{branch!r} is not a valid branch name")
        exists = await self.git.run(
            project.path, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False
        )
        if exists.ok and params.base:
            raise _err(
                ErrorKind.CONFLICT,
                f"branch {branch!r} already exists; omit base to check it out, or pick a branch",
                branch=branch,
            )
        spec = f"refs/heads/{branch}" if exists.ok else (params.base or "HEAD")
        resolved = await self.git.run(
            project.path, "rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}", check=False
        )
        if not resolved.ok:
            raise _err(
                ErrorKind.NOT_FOUND,
                f"base {spec!r} is not a commit in {project.path}",
                base=spec,
            )
        return branch, resolved.output.text().strip(), not exists.ok

    async def _worktree_add(
        self, repo: Path, row: WorkspaceRow, branch: str, new_from: str | None
    ) -> list[str]:
        """`git worktree add --lock --reason <marker>`: the lock is atomic with the add and its
        reason is the incarnation marker. With `new_from`, the branch is created (-b)."""
        reason = marker.Marker(row.id, row.incarnation).reason()
        args = ["worktree", "add", "--lock", "--reason", reason]
        if new_from is not None:
            args += ["-b", branch, "--", str(row.path), new_from]
        else:
            args += ["--", str(row.path), branch]
        async with self.git.admin_lock(repo):
            cleared = await self._clear_stale_locks(repo)
            await self.git.run(repo, *args, what="git worktree add")
        return cleared

    async def _undo_create(
        self,
        project: ProjectRow,
        row: WorkspaceRow,
        made: bool,
        created_branch: bool,
        cause: BaseException,
    ) -> None:
        """Undo exactly what this create made: the worktree (or directory), the branch if it
        was created here, then the intent row."""
        log.warning("workspace.create_undo", workspace=row.id, cause=repr(cause))
        if made and row.runtime == "worktree":
            await self._remove_worktree(project.path, row)
            if created_branch and row.branch and row.base:
                async with self.git.admin_lock(project.path):
                    # Only when it still points where we created it: never drop others' work.
                    await self.git.run(
                        project.path,
                        "update-ref",
                        "-d",
                        f"refs/heads/{row.branch}",
                        row.base,
                        check=False,
                    )
        elif (
            made
            and row.path.is_dir()
            and marker.read_directory_marker(row.path) == marker.Marker(row.id, row.incarnation)
        ):
            shutil.rmtree(row.path, ignore_errors=True)
        with self.store.transaction():
            self.store.execute("DELETE FROM workspaces WHERE id = ?", (row.id,))
        self.app.events.publish("workspace.removed", workspace_id=row.id, reason="create failed")

    async def _remove_worktree(self, repo: Path, row: WorkspaceRow) -> None:
        """Remove a worktree this operation made (marker-checked), and git's admin entry."""
        async with self.git.admin_lock(repo):
            found = marker.read_worktree_marker(row.path)
            # `remove -f -f` also drops the admin entry of a locked worktree whose directory
            # is gone (a prune would touch the user's other stale entries too).
            if found == marker.Marker(row.id, row.incarnation) or not os.path.lexists(row.path):
                await self.git.run(
                    repo, "worktree", "remove", "--force", "--force", str(row.path), check=False
                )

    # -- read ------------------------------------------------------------------------------------

    def get(self, workspace_id: str) -> WorkspaceResult:
        return WorkspaceResult(workspace=self.info(self.row(workspace_id)))

    def list_workspaces(self, project_id: str | None, state: str | None) -> list[WorkspaceInfo]:
        if project_id is not None:
            self.project(project_id)
        return [self.info(r) for r in rows.list_workspaces(self.store, project_id, state)]

    # -- archive ---------------------------------------------------------------------------------

    async def archive(self, workspace_id: str, stop: bool = False) -> WorkspaceArchiveResult:
        async with self.coord.exclusive(workspace_id, "archive") as ref:
            row = self.row(ref.id)
            if row.state != "active":
                raise _err(
                    ErrorKind.INVALID_STATE,
                    f"workspace {row.name!r} is {row.state}; only an active workspace is archived",
                    state=row.state,
                )
            stopped: list[str] = []
            if stop:
                left = await self._hooks().stop_all(ref, self.app.config.stop_grace_s + 5.0)
                if left:
                    raise _err(
                        ErrorKind.BUSY,
                        f"cannot archive {row.name!r}: could not stop "
                        + busy_message(left)[len("busy: ") :],
                        holders=[h.as_dict() for h in left],
                    )
                stopped = ["the daemon's processes in the workspace"]
            await self._quiescent(row, "archive")
            project = self.project(row.project_id)
            with self.store.transaction():
                row = self._update(row, state="archiving")
            self.publish("workspace.state_changed", row)
            ARCHIVE_AFTER_INTENT()
            try:
                snap, dropped = await self._save_work(project, row)
            except BaseException:
                with self.store.transaction():
                    back = rows.update_workspace(
                        self.store, row.id, expect_incarnation=row.incarnation, state="active"
                    )
                if back is not None:
                    self.publish("workspace.state_changed", back)
                raise
            ARCHIVE_AFTER_SNAPSHOT()
            with self.store.transaction():
                fields: dict[str, Any] = {"state": "archived"}
                if snap is not None:
                    fields.update(snapshot_ref=snap.ref, snapshot_commit=snap.commit)
                row = self._update(row, **fields)
                self.cleanup.plan_checkout_removal(
                    workspace_id=row.id,
                    project_id=row.project_id,
                    incarnation=row.incarnation,
                    runtime=row.runtime,
                    repo_path=project.path,
                    checkout=row.path,
                    dev=row.dev,
                    ino=row.ino,
                    teardown=True,
                )
            self.publish("workspace.state_changed", row)
            ARCHIVE_AFTER_COMMIT()
            status = await self._run_cleanup(row.id)
            row = rows.get_workspace(self.store, row.id) or row
            return WorkspaceArchiveResult(
                workspace=self.info(row),
                snapshot=SnapshotInfo.model_validate(snap.as_dict()) if snap else None,
                dropped=DroppedInfo.model_validate(dropped.as_dict()),
                cleanup=status,
                stopped=stopped,
            )

    async def _run_cleanup(self, workspace_id: str, *, force: bool = False) -> CleanupStatus:
        try:
            return await self.cleanup.run_workspace(workspace_id, force=force)
        except XumError as exc:
            # The logical change is committed; the physical one is reported as it is.
            return CleanupStatus(status="pending", last_error=exc.message)

    async def _save_work(
        self, project: ProjectRow, row: WorkspaceRow
    ) -> tuple[Snapshot | None, Dropped]:
        """Snapshot uncommitted work and preserve chosen ignored files, touching nothing."""
        if not self._owns_checkout(row):
            if os.path.lexists(row.path):
                raise _err(
                    ErrorKind.CONFLICT,
                    f"{row.path} does not carry the marker of {row.id}; refusing to snapshot it",
                    path=str(row.path),
                )
            return None, Dropped()  # deleted by hand: nothing left to save
        globs = preserve_globs(row.path, project.path)
        if row.runtime == "directory":
            return None, await self._save_directory(row)
        async with self.git.admin_lock(project.path):
            await self._clear_stale_locks(project.path)
            snap = await self.snapshots.take(row.path, row.id, row.incarnation)
        dropped = await self.snapshots.report_and_preserve(row.path, row.id, row.incarnation, globs)
        return snap, dropped

    async def _save_directory(self, row: WorkspaceRow) -> Dropped:
        """A plain directory has no git to snapshot into: its content goes to the archive store."""

        def copy() -> Dropped:
            store = self.app.paths.archive_store / row.id
            tmp = self.app.paths.archive_store / f".{row.id}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(
                row.path,
                tmp / "content",
                symlinks=True,
                ignore=shutil.ignore_patterns(marker.DIRECTORY_MARKER),
            )
            files = [
                str(Path(d, f).relative_to(tmp / "content"))
                for d, _, fs in os.walk(tmp / "content")
                for f in fs
            ]
            (tmp / "manifest.json").write_text(json.dumps({"directory": True, "files": files}))
            shutil.rmtree(store, ignore_errors=True)
            os.replace(tmp, store)
            return Dropped(preserved=sorted(files))

        self.app.paths.archive_store.mkdir(parents=True, exist_ok=True)
        return await anyio.to_thread.run_sync(copy)

    # -- unarchive -------------------------------------------------------------------------------

    async def unarchive(self, workspace_id: str) -> WorkspaceUnarchiveResult:
        async with self.coord.exclusive(workspace_id, "unarchive") as ref:
            row = self.row(ref.id)
            if row.state != "archived":
                raise _err(
                    ErrorKind.INVALID_STATE,
                    f"workspace {row.name!r} is {row.state}; only an archived one is unarchived",
                    state=row.state,
                )
            project = self.project(row.project_id)
            await self._settle_old_checkout(row)
            self._check_path_free(row)
            old = row
            with self.store.transaction():
                row = self._update(
                    row, state="restoring", incarnation=ids.new_incarnation(), dev=None, ino=None
                )
            self.publish("workspace.state_changed", row)
            UNARCHIVE_AFTER_INTENT()
            made = False
            try:
                async with self.coord.directory(row.path, label=f"unarchive {row.id}"):
                    self._check_path_free(row)
                    row.path.parent.mkdir(parents=True, exist_ok=True)
                    made = True
                    await self._recreate(project, row)
                UNARCHIVE_AFTER_CHECKOUT()
                restored = await self._restore(row)
                UNARCHIVE_AFTER_RESTORE()
                st = row.path.stat()
                with self.store.transaction():
                    row = self._update(row, dev=st.st_dev, ino=st.st_ino)
            except BaseException:
                with anyio.CancelScope(shield=True), anyio.move_on_after(UNDO_DEADLINE_S):
                    await self._undo_unarchive(project, old, row, made)
                raise
            row, outcome = await self._setup(row)
            UNARCHIVE_AFTER_SETUP()
            with self.store.transaction():
                row = self._update(row, state="active", **self._script_fields(outcome))
            self.snapshots.discard_preserved(row.id)
            self.publish("workspace.state_changed", row)
            return WorkspaceUnarchiveResult(
                workspace=self.info(row), restored=restored, setup=self._status_of(outcome)
            )

    async def _settle_old_checkout(self, row: WorkspaceRow) -> None:
        """Run the archive's pending cleanup now (forced), before the new incarnation exists:
        it frees the path and drops the old incarnation's locked git admin entry, without which
        `git worktree add` refuses the path ("missing but locked"). The cleanup takes the
        directory exclusion itself, so this runs before unarchive takes it. An old checkout that
        gained work after the archive (which the snapshot does not hold) is refused first:
        trashing it would lose that work."""
        status = self.cleanup.status(row.id)
        if status is None or status.status != "pending":
            return
        if row.runtime == "worktree" and self._owns_checkout(row):
            state = await self.snapshots.capture(row.path)
            files = await self.snapshots.unsaved_files(row.path, state, row.snapshot_commit)
            if files:
                raise _err(
                    ErrorKind.NOT_SAFE,
                    f"the archived checkout of {row.name!r} at {row.path} has work that its "
                    f"snapshot does not hold: {_some(files)}; commit it or move it away first",
                    files=files[:100],
                    path=str(row.path),
                )
        await self._run_cleanup(row.id, force=True)

    def _check_path_free(self, row: WorkspaceRow) -> None:
        if not os.path.lexists(row.path):
            return
        status = self.cleanup.status(row.id)
        if status is not None and status.status in ("pending", "failed"):
            raise _err(
                ErrorKind.CLEANUP_PENDING,
                f"{row.path} still holds the archived checkout (cleanup {status.status}"
                + (
                    f": {status.last_error or status.reason}"
                    if status.last_error or status.reason
                    else ""
                )
                + ")",
                cleanup=status.model_dump(mode="json"),
                path=str(row.path),
            )
        raise _err(ErrorKind.CONFLICT, f"{row.path} exists; move it away first", path=str(row.path))

    async def _recreate(self, project: ProjectRow, row: WorkspaceRow) -> None:
        if row.runtime == "directory":
            row.path.mkdir()
            marker.write_directory_marker(row.path, marker.Marker(row.id, row.incarnation))
            return
        assert row.branch is not None
        exists = await self.git.run(
            project.path,
            "rev-parse",
            "--verify",
            "--quiet",
            f"refs/heads/{row.branch}",
            check=False,
        )
        if exists.ok:
            await self._worktree_add(project.path, row, row.branch, None)
        elif row.snapshot_commit:
            # The branch was deleted by hand: bring it back where the snapshot was taken.
            await self._worktree_add(project.path, row, row.branch, f"{row.snapshot_commit}^1")
        else:
            raise _err(
                ErrorKind.NOT_FOUND,
                f"branch {row.branch!r} no longer exists and no snapshot holds its work",
                branch=row.branch,
            )

    async def _restore(self, row: WorkspaceRow) -> RestoredInfo:
        if row.runtime == "directory":
            return await anyio.to_thread.run_sync(self._restore_directory, row)
        snap: SnapshotInfo | None = None
        if row.snapshot_commit and row.snapshot_ref:
            files = await self.snapshots.restore(row.path, row.snapshot_commit)
            snap = SnapshotInfo(ref=row.snapshot_ref, commit=row.snapshot_commit, files=files)
        preserved = self.snapshots.restore_preserved(row.id, row.path)
        return RestoredInfo(snapshot=snap, preserved=preserved)

    def _restore_directory(self, row: WorkspaceRow) -> RestoredInfo:
        content = self.app.paths.archive_store / row.id / "content"
        restored: list[str] = []
        if content.is_dir():
            shutil.copytree(content, row.path, symlinks=True, dirs_exist_ok=True)
            restored = sorted(
                str(Path(d, f).relative_to(content)) for d, _, fs in os.walk(content) for f in fs
            )
        return RestoredInfo(preserved=restored)

    async def _undo_unarchive(
        self, project: ProjectRow, old: WorkspaceRow, row: WorkspaceRow, made: bool
    ) -> None:
        log.warning("workspace.unarchive_undo", workspace=row.id)
        if made:
            if row.runtime == "worktree":
                await self._remove_worktree(project.path, row)
            elif marker.read_directory_marker(row.path) == marker.Marker(row.id, row.incarnation):
                shutil.rmtree(row.path, ignore_errors=True)
        with self.store.transaction():
            back = rows.update_workspace(
                self.store,
                row.id,
                expect_incarnation=row.incarnation,
                state="archived",
                incarnation=old.incarnation,
                dev=old.dev,
                ino=old.ino,
            )
        if back is not None:
            self.publish("workspace.state_changed", back)

    # -- remove ----------------------------------------------------------------------------------

    async def remove(self, workspace_id: str, force: bool = False) -> WorkspaceRemoveResult:
        async with self.coord.exclusive(workspace_id, "remove") as ref:
            row = self.row(ref.id)
            removable = row.state in ("active", "archived") or (
                row.state == "creating" and row.interrupted
            )
            if not removable:
                raise _err(
                    ErrorKind.INVALID_STATE,
                    f"workspace {row.name!r} is {row.state}; wait for it to settle",
                    state=row.state,
                )
            project = self.project(row.project_id)
            live = row.state != "archived"
            owns = live and self._owns_checkout(row)
            if live:
                await self._quiescent(row, "remove")
            state = None
            if owns and row.runtime == "worktree":
                state = await self.snapshots.capture(row.path)
                if state.dirty and not force:
                    held = await self.snapshots.holds(row.path, state, row.snapshot_commit)
                    if not held:
                        files = await self.snapshots.dirty_files(row.path)
                        raise _err(
                            ErrorKind.NOT_SAFE,
                            f"workspace {row.name!r} has uncommitted work that no snapshot "
                            f"holds: {_some(files)}; commit it, archive the workspace, or "
                            "remove with force",
                            files=files,
                        )
            elif owns and not force and self._directory_has_content(row):
                raise _err(
                    ErrorKind.NOT_SAFE,
                    f"directory workspace {row.name!r} has files no snapshot holds; archive it "
                    "or remove with force",
                    files=self._directory_files(row)[:100],
                )
            with self.store.transaction():
                row = self._update(row, state="removing")
            self.publish("workspace.state_changed", row)
            REMOVE_AFTER_INTENT()
            snap: Snapshot | None = None
            dropped = Dropped()
            if owns:
                if state is not None and state.dirty:
                    async with self.git.admin_lock(project.path):
                        snap = await self.snapshots.take(
                            row.path, row.id, row.incarnation, state=state
                        )
                    REMOVE_AFTER_SNAPSHOT()
                if row.runtime == "worktree":
                    dropped = await self.snapshots.report_and_preserve(
                        row.path, row.id, row.incarnation, []
                    )
                elif force:
                    dropped = await self._save_directory(row)
            with self.store.transaction():
                if snap is not None:
                    row = self._update(row, snapshot_ref=snap.ref, snapshot_commit=snap.commit)
                if live:
                    self.cleanup.plan_checkout_removal(
                        workspace_id=row.id,
                        project_id=row.project_id,
                        incarnation=row.incarnation,
                        runtime=row.runtime,
                        repo_path=project.path,
                        checkout=row.path,
                        dev=row.dev,
                        ino=row.ino,
                        teardown=owns,
                    )
                rows.delete_workspace_with_tombstone(self.store, row)
            REMOVE_AFTER_COMMIT()
            self.app.events.publish(
                "workspace.removed", workspace_id=row.id, project_id=row.project_id, name=row.name
            )
            if live:
                cleanup = await self._run_cleanup(row.id)
            else:
                cleanup = self.cleanup.status(row.id) or CleanupStatus(
                    status="not_needed", reason="the archived checkout was already cleaned up"
                )
            log.info("workspace.removed", workspace=row.id, cleanup=cleanup.status)
            return WorkspaceRemoveResult(
                workspace_id=row.id,
                removed=True,
                branch=row.branch,
                snapshot=SnapshotInfo.model_validate(snap.as_dict()) if snap else None,
                dropped=DroppedInfo.model_validate(dropped.as_dict()),
                cleanup=cleanup,
            )

    def _directory_files(self, row: WorkspaceRow) -> list[str]:
        return sorted(
            str(Path(d, f).relative_to(row.path))
            for d, _, fs in os.walk(row.path)
            for f in fs
            if not (Path(d) == row.path and f == marker.DIRECTORY_MARKER)
        )

    def _directory_has_content(self, row: WorkspaceRow) -> bool:
        return bool(self._directory_files(row))

    # -- rename ----------------------------------------------------------------------------------

    async def rename(self, workspace_id: str, name: str) -> WorkspaceRenameResult:
        ids.check_name(name)
        async with self.coord.exclusive(workspace_id, "rename") as ref:
            row = self.row(ref.id)
            if row.state not in ("active", "archived"):
                raise _err(
                    ErrorKind.INVALID_STATE,
                    f"workspace {row.name!r} is {row.state}; cannot rename it now",
                    state=row.state,
                )
            project = self.project(row.project_id)
            old = row
            if name == row.name:
                return WorkspaceRenameResult(
                    workspace=self.info(row),
                    previous_name=row.name,
                    previous_path=str(row.path),
                    branch_renamed=False,
                )
            other = rows.workspace_by_name(self.store, row.project_id, name)
            if other is not None:
                raise _err(
                    ErrorKind.CONFLICT,
                    f"project {project.name!r} already has a workspace {name!r} ({other.id})",
                    id=other.id,
                )
            new_path = self.path_for(project, name)
            new_branch = row.branch
            if row.runtime == "worktree" and row.branch == f"xum/{row.name}":
                new_branch = f"xum/{name}"
                taken = await self.git.run(
                    project.path,
                    "rev-parse",
                    "--verify",
                    "--quiet",
                    f"refs/heads/{new_branch}",
                    check=False,
                )
                if taken.ok:
                    raise _err(
                        ErrorKind.CONFLICT,
                        f"branch {new_branch!r} already exists",
                        branch=new_branch,
                    )
            live = row.state == "active"
            if live:
                await self._quiescent(row, "rename")
                if os.path.lexists(new_path):
                    raise _err(ErrorKind.CONFLICT, f"{new_path} already exists", path=str(new_path))
            with self.store.transaction():
                self.store.execute(
                    "INSERT INTO rename_journal (workspace_id, from_name, to_name, from_path,"
                    " to_path, from_branch, to_branch, incarnation, phase, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'intent', ?)",
                    (
                        row.id,
                        row.name,
                        name,
                        str(row.path),
                        str(new_path),
                        row.branch,
                        new_branch,
                        row.incarnation,
                        time.time(),
                    ),
                )
            RENAME_AFTER_JOURNAL()
            moved = False
            branch_renamed = False
            try:
                if live:
                    await self._move(project, row, new_path)
                    moved = True
                    self._journal_phase(row.id, "moved")
                    RENAME_AFTER_MOVE()
                if new_branch != row.branch and row.branch and new_branch:
                    async with self.git.admin_lock(project.path):
                        await self.git.run(
                            project.path,
                            "branch",
                            "-m",
                            "--",
                            row.branch,
                            new_branch,
                            what="git branch -m",
                        )
                    branch_renamed = True
                    self._journal_phase(row.id, "branch_renamed")
                    RENAME_AFTER_BRANCH()
                with self.store.transaction():
                    row = self._update(row, name=name, path=str(new_path), branch=new_branch)
                    self.store.execute(
                        "DELETE FROM rename_journal WHERE workspace_id = ?", (row.id,)
                    )
            except BaseException:
                with anyio.CancelScope(shield=True), anyio.move_on_after(UNDO_DEADLINE_S):
                    await self._undo_rename(
                        project=project,
                        old=old,
                        new_path=new_path,
                        new_branch=new_branch,
                        moved=moved,
                        branch_renamed=branch_renamed,
                    )
                raise
            self.publish("workspace.renamed", row, previous_name=old.name)
            return WorkspaceRenameResult(
                workspace=self.info(row),
                previous_name=old.name,
                previous_path=str(old.path),
                branch_renamed=branch_renamed,
            )

    def _journal_phase(self, workspace_id: str, phase: str) -> None:
        with self.store.transaction():
            self.store.execute(
                "UPDATE rename_journal SET phase = ? WHERE workspace_id = ?", (phase, workspace_id)
            )

    async def _move(self, project: ProjectRow, row: WorkspaceRow, new_path: Path) -> None:
        async with self._directories(row.path, new_path):
            if os.path.lexists(new_path):
                raise _err(ErrorKind.CONFLICT, f"{new_path} already exists", path=str(new_path))
            if not self._owns_checkout(row):
                raise _err(
                    ErrorKind.CONFLICT,
                    f"{row.path} does not carry the marker of {row.id}; refusing to move it",
                )
            new_path.parent.mkdir(parents=True, exist_ok=True)
            if row.runtime == "worktree":
                async with self.git.admin_lock(project.path):
                    await self._clear_stale_locks(project.path)
                    # A locked worktree moves only with -f -f (git 2.39); the lock and its
                    # reason (our marker) stay with the admin dir.
                    await self.git.run(
                        project.path,
                        "worktree",
                        "move",
                        "-f",
                        "-f",
                        str(row.path),
                        str(new_path),
                        what="git worktree move",
                    )
            else:
                os.rename(row.path, new_path)

    async def _undo_rename(
        self,
        *,
        project: ProjectRow,
        old: WorkspaceRow,
        new_path: Path,
        new_branch: str | None,
        moved: bool,
        branch_renamed: bool,
    ) -> None:
        log.warning("workspace.rename_undo", workspace=old.id)
        try:
            if branch_renamed and old.branch and new_branch:
                async with self.git.admin_lock(project.path):
                    await self.git.run(
                        project.path, "branch", "-m", "--", new_branch, old.branch, check=False
                    )
            if moved:
                if old.runtime == "worktree":
                    async with self.git.admin_lock(project.path):
                        await self.git.run(
                            project.path,
                            "worktree",
                            "move",
                            "-f",
                            "-f",
                            str(new_path),
                            str(old.path),
                            check=False,
                        )
                elif os.path.lexists(new_path) and not os.path.lexists(old.path):
                    os.rename(new_path, old.path)
        finally:
            with self.store.transaction():
                self.store.execute("DELETE FROM rename_journal WHERE workspace_id = ?", (old.id,))

    # -- keep ------------------------------------------------------------------------------------

    async def keep(self, workspace_id: str) -> WorkspaceResult:
        async with self.coord.exclusive(workspace_id, "keep") as ref:
            row = self.row(ref.id)
            if not row.interrupted:
                raise _err(
                    ErrorKind.INVALID_STATE,
                    f"workspace {row.name!r} is not interrupted; nothing to keep",
                    state=row.state,
                )
            fields: dict[str, Any] = {"interrupted": 0, "interrupted_reason": None}
            if row.state == "creating":
                if not self._owns_checkout(row):
                    raise _err(
                        ErrorKind.INVALID_STATE,
                        f"the checkout of {row.name!r} is missing or not ours; remove it instead",
                        path=str(row.path),
                    )
                st = row.path.stat()
                fields.update(state="active", dev=st.st_dev, ino=st.st_ino)
                if row.setup_status in ("pending", "running"):
                    fields.update(
                        setup_status="failed",
                        setup_output=json.dumps({"error": "setup was interrupted"}),
                    )
            with self.store.transaction():
                row = self._update(row, **fields)
            self.publish("workspace.state_changed", row)
            return WorkspaceResult(workspace=self.info(row))
