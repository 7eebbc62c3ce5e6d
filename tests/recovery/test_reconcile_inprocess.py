"""The startup pass (recovery/reconcile.py) in-process: every decision it makes, each record state
against what is on disk, with a real SQLite store in a temp dir, real git repositories and
worktrees, real directories and incarnation markers, and the real composition root (no daemon
process). The daemon-level tests (test_recovery.py, the crash matrix) prove the same pass from
the outside; these are fast enough to be the mutation selection of reconcile.py.

Rows and rename journals are written as a crash leaves them (the statements are the ones the
lifecycle code commits); the disk is arranged by hand: a checkout present, missing, swapped for
another directory, carrying another incarnation's marker, moved, a branch renamed or not, a ref
lock left by a crashed git, saved copies of preserved files."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from xum_protocol.errors import ErrorKind
from xum_protocol.models.events import Event
from xumd.app import App
from xumd.base import faults
from xumd.base.config import DaemonConfig
from xumd.base.errors import XumError
from xumd.base.paths import RootPaths
from xumd.checkouts.marker import Marker, write_directory_marker
from xumd.cleanup.service import CleanupService
from xumd.lifecycle import rows
from xumd.lifecycle.rows import WorkspaceRow
from xumd.lifecycle.service import WorkspaceService
from xumd.recovery.reconcile import Reconciler, RecoveryReport
from xumd.startup.composition import install_features
from xumd.store import Store
from xumd.system.git import Git

from tests.support.gitrepo import GIT_ENV, git, make_repo

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def new_id() -> str:
    return "ws_" + secrets.token_hex(8)


@dataclass
class Env:
    app: App
    rec: Reconciler
    repo: Path
    project_id: str
    events: list[Event]

    @property
    def store(self) -> Store:
        return self.app.store

    def path(self, name: str) -> Path:
        return self.app.paths.workspaces / "repo" / name

    def add(
        self,
        name: str,
        state: str,
        *,
        runtime: str = "directory",
        branch: str | None = None,
        setup_status: str = "ok",
        interrupted: bool = False,
        reason: str | None = None,
        wid: str | None = None,
    ) -> str:
        """A workspace row as the lifecycle code commits it (no identity recorded yet)."""
        wid = wid or new_id()
        now = time.time()
        with self.store.transaction():
            self.store.execute(
                "INSERT INTO workspaces (id, project_id, name, runtime, path, branch, state,"
                " incarnation, interrupted, interrupted_reason, setup_status, created_at,"
                " updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    wid,
                    self.project_id,
                    name,
                    runtime,
                    str(self.path(name)),
                    branch,
                    state,
                    "inc" + secrets.token_hex(6),
                    int(interrupted),
                    reason,
                    setup_status,
                    now,
                    now,
                ),
            )
        return wid

    def row(self, wid: str) -> WorkspaceRow:
        found = rows.get_workspace(self.store, wid)
        assert found is not None, wid
        return found

    def update(self, wid: str, **fields: Any) -> None:
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self.store.transaction():
            self.store.execute(
                f"UPDATE workspaces SET {sets} WHERE id = ?", (*fields.values(), wid)
            )

    def directory(
        self, wid: str, *, incarnation: str | None = None, at: Path | None = None
    ) -> Path:
        """The directory runtime's checkout: a directory with its incarnation marker."""
        row = self.row(wid)
        path = at or row.path
        path.mkdir(parents=True)
        write_directory_marker(path, Marker(wid, incarnation or row.incarnation))
        (path / "work.txt").write_text("the user's work\n")
        return path

    def worktree(self, wid: str) -> Path:
        """The worktree runtime's checkout, locked with the marker (as `workspace.create`)."""
        row = self.row(wid)
        assert row.branch is not None
        row.path.parent.mkdir(parents=True, exist_ok=True)
        reason = Marker(wid, row.incarnation).reason()
        git(self.repo, "worktree", "add", "-q", "--lock", "--reason", reason, "-b", row.branch,
            str(row.path))  # fmt: skip
        return row.path

    def identify(self, wid: str) -> tuple[int, int]:
        """Record the checkout's identity, as the row has once the checkout was made."""
        st = os.lstat(self.row(wid).path)
        self.update(wid, dev=st.st_dev, ino=st.st_ino)
        return st.st_dev, st.st_ino

    def journal(
        self,
        wid: str,
        to_name: str,
        *,
        from_branch: str | None = None,
        to_branch: str | None = None,
        incarnation: str | None = None,
    ) -> Path:
        """A rename journal as `workspace.rename` writes it first; returns the new path."""
        row = self.row(wid)
        to_path = self.path(to_name)
        with self.store.transaction():
            self.store.execute(
                "INSERT INTO rename_journal (workspace_id, from_name, to_name, from_path,"
                " to_path, from_branch, to_branch, incarnation, phase, created_at)"
                " VALUES (?,?,?,?,?,?,?,?,'intent',?)",
                (
                    wid,
                    row.name,
                    to_name,
                    str(row.path),
                    str(to_path),
                    from_branch,
                    to_branch,
                    incarnation or row.incarnation,
                    time.time(),
                ),
            )
        return to_path

    def has_journal(self, wid: str) -> bool:
        found = self.store.one("SELECT 1 FROM rename_journal WHERE workspace_id = ?", (wid,))
        return found is not None

    def branches(self) -> set[str]:
        out = git(self.repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/")
        return set(out.split())

    def recovered(self) -> dict[str, str]:
        """Workspace id -> the `recovered` action of its state_changed events."""
        return {
            e.data["workspace"]["id"]: e.data["recovered"]
            for e in self.events
            if e.type == "workspace.state_changed"
        }

    def interrupted_events(self) -> dict[str, str]:
        return {
            e.data["workspace"]["id"]: e.data["reason"]
            for e in self.events
            if e.type == "workspace.interrupted"
        }

    def obligations(self, wid: str) -> list[tuple[str, int | None, int | None]]:
        cleanup = self.app.find(CleanupService)
        assert cleanup is not None
        return [(o.kind, o.dev, o.ino) for o in cleanup.obligations.for_workspace(wid)]

    def status(self) -> dict[str, Any]:
        provided: dict[str, Any] = self.app.status_providers["recovery"]()
        return provided


@pytest.fixture
def env(tmp_short: Path) -> Iterator[Env]:
    paths = RootPaths(tmp_short / "root")
    paths.root.mkdir()
    store = Store(paths.database)
    store.migrate()
    app = App(paths, DaemonConfig(), store)
    install_features(app)
    rec = app.find(Reconciler)
    git_runner = app.find(Git)
    assert rec is not None and git_runner is not None
    # A ref lock left by a crashed git (lock_ref) is reported at once, not waited for.
    git_runner.lock_wait_s = 0.0
    repo = make_repo(tmp_short / "repo")
    st = os.stat(repo)
    project_id = "prj_" + secrets.token_hex(8)
    now = time.time()
    with store.transaction():
        store.execute(
            "INSERT INTO projects (id, name, path, dev, ino, kind, created_at, updated_at)"
            " VALUES (?, 'repo', ?, ?, ?, 'git', ?, ?)",
            (project_id, str(repo), st.st_dev, st.st_ino, now, now),
        )
    events: list[Event] = []
    app.events.listen(events.append)
    try:
        yield Env(app, rec, repo, project_id, events)
    finally:
        store.close()


def swap_in(path: Path, make: Callable[[Path], None]) -> None:
    """Replace the directory at `path` by a new one made by `make`, the new one made while the
    old one still exists: its inode number cannot be the old one's (a delete-then-create may get
    the freed number back, and then only the marker would tell them apart)."""
    new = path.with_name(path.name + ".new")
    new.mkdir()
    make(new)
    os.rename(path, path.with_name(path.name + ".old"))
    os.rename(new, path)


# -- the report ------------------------------------------------------------------------------------


def test_a_report_before_any_pass_counts_nothing() -> None:
    # What `daemon.status` shows as the last pass until the first one finished.
    assert RecoveryReport().as_dict() == {
        "rows": 0,
        "actions": {},
        "interrupted_now": 0,
        "missing_checkouts": 0,
        "turns": {},
        "ms": 0.0,
    }


async def test_settled_rows_are_skipped_and_the_rest_still_reconciled(env: Env) -> None:
    """Archived rows and active rows whose identity agrees are skipped without a decision, and
    the loop goes on past them to the rows that need one (rows come in insertion order)."""
    archived = env.add("arch", "archived")
    settled = env.add("settled", "active")
    env.directory(settled)
    env.identify(settled)
    first = env.add("c1", "creating")
    second = env.add("c2", "creating", setup_status="none")
    for wid in (first, second):
        env.directory(wid)
    versions = {wid: env.row(wid).version for wid in (archived, settled)}
    started = time.perf_counter()
    report = await env.rec.run()
    elapsed_ms = (time.perf_counter() - started) * 1000
    assert report.rows == 4
    assert report.actions == {"completed": 2}
    assert report.interrupted == [] and report.missing == []
    assert 0 <= report.ms <= elapsed_ms
    for wid in (first, second):
        row = env.row(wid)
        st = os.lstat(row.path)
        assert (row.state, row.interrupted) == ("active", False)
        assert (row.dev, row.ino) == (st.st_dev, st.st_ino)
    assert {wid: env.row(wid).version for wid in versions} == versions
    assert env.recovered() == {first: "completed", second: "completed"}
    assert env.interrupted_events() == {}
    # A second pass finds nothing to do: the completed rows are settled now.
    env.events.clear()
    again = await env.rec.run()
    assert again.actions == {} and env.events == []


# -- creating --------------------------------------------------------------------------------------


async def test_creating_rows_by_what_the_disk_shows(env: Env) -> None:
    done = env.add("done", "creating", setup_status="ok")
    env.directory(done)
    tree = env.add("tree", "creating", runtime="worktree", branch="xum/tree", setup_status="failed")
    env.worktree(tree)
    pending = env.add("pending", "creating", setup_status="pending")
    env.directory(pending)
    running = env.add("running", "creating", setup_status="running")
    env.directory(running)
    # Setup's outcome was written, but the checkout is not there (deleted by hand).
    absent = env.add("absent", "creating", setup_status="ok")
    foreign = env.add("foreign", "creating")
    env.row(foreign).path.mkdir(parents=True)
    (env.row(foreign).path / "theirs.txt").write_text("someone else's\n")
    # The marker of another incarnation of this very workspace (a successor, or a leftover).
    other = env.add("other", "creating")
    env.directory(other, incarnation="incsomeoneelse")
    flagged = env.add("flagged", "creating", interrupted=True, reason="decided earlier")
    env.directory(flagged)

    report = await env.rec.run()

    for wid in (done, tree):
        row = env.row(wid)
        st = os.lstat(row.path)
        assert (row.state, row.interrupted, row.interrupted_reason) == ("active", False, None)
        assert (row.dev, row.ino) == (st.st_dev, st.st_ino)
    for wid in (pending, running):
        row = env.row(wid)
        st = os.lstat(row.path)
        assert (row.state, row.interrupted) == ("creating", True)
        assert row.interrupted_reason is not None
        assert "setup never finished" in row.interrupted_reason
        assert (row.dev, row.ino) == (st.st_dev, st.st_ino)
    gone = env.row(absent)
    assert (gone.state, gone.interrupted) == ("creating", True)
    assert gone.interrupted_reason == (
        "creation was interrupted before the checkout was made (remove it)"
    )
    assert gone.ino is None
    for wid, what in ((foreign, "no marker"), (other, "incsomeoneelse")):
        row = env.row(wid)
        assert (row.state, row.interrupted, row.ino) == ("creating", True, None)
        assert row.interrupted_reason is not None
        assert row.interrupted_reason.startswith("creation was interrupted; ")
        assert what in row.interrupted_reason and "left alone" in row.interrupted_reason
    assert (env.row(foreign).path / "theirs.txt").read_text() == "someone else's\n"
    kept = env.row(flagged)
    assert (kept.state, kept.interrupted_reason, kept.version) == ("creating", "decided earlier", 1)

    now_flagged = {pending, running, absent, foreign, other}
    assert report.actions == {"completed": 2, "interrupted": 5}
    assert sorted(report.interrupted) == sorted(now_flagged)
    assert env.recovered() == {
        done: "completed",
        tree: "completed",
        **{wid: "interrupted" for wid in now_flagged},
    }
    assert env.interrupted_events() == {wid: env.row(wid).interrupted_reason for wid in now_flagged}
    # The status counts the flag as the store holds it (interrupted = 1).
    assert env.status()["interrupted"] == 6
    assert env.store.one("SELECT COUNT(*) AS n FROM workspaces WHERE interrupted = 1")["n"] == 6


# -- archiving -------------------------------------------------------------------------------------


async def test_archiving_rows_roll_back_unless_another_directory_is_there(env: Env) -> None:
    ours = env.add("ours", "archiving", runtime="worktree", branch="xum/ours")
    env.worktree(ours)
    env.identify(ours)
    absent = env.add("absent", "archiving")
    swapped = env.add("swapped", "archiving")
    env.directory(swapped)
    env.identify(swapped)
    # The same marker, but another directory (identity differs): not the one archived.
    swap_in(
        env.row(swapped).path,
        lambda p: write_directory_marker(p, Marker(swapped, env.row(swapped).incarnation)),
    )

    report = await env.rec.run()

    for wid in (ours, absent):
        row = env.row(wid)
        assert (row.state, row.interrupted, row.interrupted_reason) == ("active", False, None)
    row = env.row(swapped)
    assert (row.state, row.interrupted) == ("active", True)
    assert row.interrupted_reason is not None
    assert row.interrupted_reason.startswith("archive was interrupted; ")
    assert "identity differs" in row.interrupted_reason
    assert report.actions == {"archive_rolled_back": 2, "interrupted": 1}
    assert report.interrupted == [swapped]
    assert env.recovered() == {
        ours: "archive_rolled_back",
        absent: "archive_rolled_back",
        swapped: "interrupted",
    }
    # Nothing was deleted: an archive is only ever rolled back here.
    assert env.row(ours).path.is_dir()
    assert env.obligations(ours) == env.obligations(swapped) == []


# -- restoring -------------------------------------------------------------------------------------


async def test_restoring_rows_roll_forward_only_when_the_restore_finished(env: Env) -> None:
    absent = env.add("absent", "restoring")
    foreign = env.add("foreign", "restoring")
    env.directory(foreign, incarnation="incearlier")
    finished = env.add("finished", "restoring", setup_status="ok")
    env.directory(finished)
    env.identify(finished)
    in_setup = env.add("insetup", "restoring", setup_status="running")
    env.directory(in_setup)
    env.identify(in_setup)
    partial = env.add("partial", "restoring", runtime="worktree", branch="xum/partial")
    env.worktree(partial)
    partial_st = os.lstat(env.row(partial).path)

    report = await env.rec.run()

    gone = env.row(absent)
    assert (gone.state, gone.interrupted) == ("archived", False)
    row = env.row(foreign)
    assert (row.state, row.interrupted) == ("archived", True)
    assert row.interrupted_reason is not None
    assert row.interrupted_reason.startswith("unarchive was interrupted; ")
    assert "incearlier" in row.interrupted_reason and "left alone" in row.interrupted_reason
    done = env.row(finished)
    assert (done.state, done.interrupted, done.setup_status) == ("active", False, "ok")
    cut = env.row(in_setup)
    assert (cut.state, cut.interrupted, cut.setup_status) == ("active", True, "failed")
    assert cut.interrupted_reason == "unarchive was interrupted during setup (keep it or remove it)"
    assert cut.setup_detail() == {"error": "setup was interrupted by a crash"}
    back = env.row(partial)
    assert (back.state, back.interrupted) == ("archived", False)
    # A restore that may be partial: rolled back, and its checkout planned for a fenced
    # cleanup (trash, reclaim; no teardown: setup never finished) by the identity probed now.
    # Nothing is deleted by the pass itself.
    ident = (partial_st.st_dev, partial_st.st_ino)
    assert env.obligations(partial) == [("trash", *ident), ("reclaim", *ident)]
    assert (back.path / "README.md").exists()
    for wid in (absent, foreign, finished, in_setup):
        assert env.obligations(wid) == []
    assert report.actions == {
        "unarchive_rolled_back": 2,
        "interrupted": 1,
        "unarchive_completed": 2,
    }
    assert sorted(report.interrupted) == sorted([foreign, in_setup])
    assert env.interrupted_events() == {
        foreign: row.interrupted_reason,
        in_setup: cut.interrupted_reason,
    }


# -- removing --------------------------------------------------------------------------------------


async def test_removing_rows_roll_back_to_where_they_came_from(env: Env) -> None:
    # A remove of a creation the user never kept (flagged): back to `creating`, flag and all.
    was_flagged = env.add("flagged", "removing", interrupted=True, reason="setup never finished")
    ours = env.add("ours", "removing")
    env.directory(ours)
    env.identify(ours)
    absent = env.add("absent", "removing")
    foreign = env.add("foreign", "removing")
    env.row(foreign).path.mkdir(parents=True)

    report = await env.rec.run()

    back = env.row(was_flagged)
    assert (back.state, back.interrupted, back.interrupted_reason) == (
        "creating",
        True,
        "setup never finished",
    )
    reason = "removal was interrupted before it was committed; remove again or keep it"
    assert (env.row(ours).state, env.row(ours).interrupted_reason) == ("active", reason)
    assert (env.row(absent).state, env.row(absent).interrupted_reason) == ("archived", reason)
    row = env.row(foreign)
    assert row.state == "archived" and row.interrupted
    assert row.interrupted_reason is not None
    assert (
        row.interrupted_reason.startswith(reason + "; ") and "no marker" in row.interrupted_reason
    )
    assert report.actions == {"remove_rolled_back": 3, "interrupted": 1}
    assert env.recovered() == {
        was_flagged: "remove_rolled_back",
        ours: "remove_rolled_back",
        absent: "remove_rolled_back",
        foreign: "interrupted",
    }
    # The already-flagged row was not flagged again by this pass.
    assert sorted(report.interrupted) == sorted([ours, absent, foreign])
    assert was_flagged not in env.interrupted_events()


async def test_a_flagged_row_goes_back_to_the_state_its_removal_began_from(env: Env) -> None:
    """A flagged active or archived workspace (flagged by an earlier pass) may be removed as
    well as a flagged creation: a removal cut short puts each back where it was, flag and
    reason kept, never turns it into a creation (an archived one could not be unarchived)."""
    reason = "unarchive was interrupted; it carries no marker (left alone)"
    prior = {
        env.add("arc", "removing", interrupted=True, reason=reason): "archived",
        env.add("act", "removing", interrupted=True, reason=reason): "active",
        env.add("cre", "removing", interrupted=True, reason=reason): "creating",
    }
    with env.store.transaction():
        for wid, state in prior.items():
            rows.record_removal_prior(env.store, wid, state)
    # Begun by a daemon that did not record it: the earlier rule (a flagged creation).
    legacy = env.add("old", "removing", interrupted=True, reason=reason)

    report = await env.rec.run()

    for wid, state in [*prior.items(), (legacy, "creating")]:
        row = env.row(wid)
        assert (row.state, row.interrupted, row.interrupted_reason) == (state, True, reason)
    assert report.actions == {"remove_rolled_back": 4}


async def test_an_unflagged_row_goes_back_to_the_state_its_removal_began_from(env: Env) -> None:
    """A removal cut by a crash puts an unflagged row back where the removal began (as its
    in-process failure does), flagged; the checkout does not decide. An archived workspace
    whose checkout lingers (its trash step pending) stays archived, not `active`; an active one
    whose checkout was deleted by hand stays active, not `archived`."""
    reason = "removal was interrupted before it was committed; remove again or keep it"
    lingering = env.add("lingering", "removing")
    env.directory(lingering)
    env.identify(lingering)
    active_gone = env.add("active-gone", "removing")
    archived_gone = env.add("archived-gone", "removing")
    active_ours = env.add("active-ours", "removing")
    env.directory(active_ours)
    env.identify(active_ours)
    active_foreign = env.add("active-foreign", "removing")
    env.row(active_foreign).path.mkdir(parents=True)
    prior = {
        lingering: "archived",
        active_gone: "active",
        archived_gone: "archived",
        active_ours: "active",
        active_foreign: "active",
    }
    with env.store.transaction():
        for wid, state in prior.items():
            rows.record_removal_prior(env.store, wid, state)

    report = await env.rec.run()

    for wid, state in prior.items():
        row = env.row(wid)
        assert (row.state, row.interrupted) == (state, True), (env.row(wid).name, row.state)
        assert row.interrupted_reason is not None
        assert row.interrupted_reason.startswith(reason)
    assert "no marker" in (env.row(active_foreign).interrupted_reason or "")
    assert (env.path("lingering") / "work.txt").read_text() == "the user's work\n"
    assert report.actions == {"remove_rolled_back": 4, "interrupted": 1}


async def test_a_failed_removal_of_a_flagged_archived_row_leaves_it_archived(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real removal: its intent records the state it began from, and the failure guard
    (recovery's own decision, as after a crash) puts the row back there."""
    reason = "removal was interrupted before it was committed; remove again or keep it"
    wid = env.add("arc", "archived", interrupted=True, reason=reason)
    service = env.app.find(WorkspaceService)
    assert service is not None
    monkeypatch.setattr(faults, "_armed", "workspace.remove.after_intent")
    monkeypatch.setattr(faults, "_mode", "raise")
    with pytest.raises(faults.FaultInjected):
        await service.remove(wid)
    row = env.row(wid)
    assert (row.state, row.interrupted) == ("archived", True)
    assert row.interrupted_reason is not None and row.interrupted_reason.endswith(reason)
    assert rows.removal_prior_state(env.store, wid) == "archived"
    # The record goes with the row.
    await service.remove(wid)
    assert env.store.one("SELECT 1 FROM workspace_removing WHERE workspace_id = ?", (wid,)) is None


# -- active ----------------------------------------------------------------------------------------


async def test_active_rows_report_a_missing_checkout_and_settle_a_cut_setup(env: Env) -> None:
    missing = env.add("missing", "active")
    env.directory(missing)
    env.identify(missing)
    shutil.rmtree(env.row(missing).path)
    swapped = env.add("swapped", "active")
    env.directory(swapped)
    env.identify(swapped)
    swap_in(
        env.row(swapped).path,
        lambda p: write_directory_marker(p, Marker(swapped, env.row(swapped).incarnation)),
    )
    # A rerun setup cut by a crash, its checkout fine (identity agrees: not the fast path).
    rerun = env.add("rerun", "active", setup_status="running")
    env.directory(rerun)
    env.identify(rerun)
    rerun_gone = env.add("rerungone", "active", setup_status="running")

    report = await env.rec.run()

    assert sorted(report.missing) == sorted([missing, swapped, rerun_gone])
    for wid in (missing, swapped):
        row = env.row(wid)
        assert (row.state, row.interrupted, row.version) == ("active", False, 1)
    error = {"error": "setup was interrupted by a crash (run it again: xum ws setup)"}
    for wid in (rerun, rerun_gone):
        row = env.row(wid)
        assert (row.state, row.interrupted, row.setup_status) == ("active", False, "failed")
        assert row.setup_detail() == error
    assert report.actions == {"setup_interrupted": 2}
    assert report.interrupted == []
    assert env.recovered() == {rerun: "setup_interrupted", rerun_gone: "setup_interrupted"}


# -- turns -----------------------------------------------------------------------------------------


async def test_turns_left_creating_are_settled_in_the_pass(env: Env) -> None:
    owner = env.add("owner", "active")
    target = env.add("target", "creating", setup_status="pending")
    now = time.time()
    with env.store.transaction():
        for turn, tgt in (("turn_" + "1" * 16, target), ("turn_" + "2" * 16, new_id())):
            env.store.execute(
                "INSERT INTO turns (id, owner_workspace_id, target_workspace_id, mode, state,"
                " created_at, updated_at) VALUES (?, ?, ?, 'new', 'creating', ?, ?)",
                (turn, owner, tgt, now, now),
            )
    report = await env.rec.run()
    assert report.turns == {"opened": 1, "failed": 1}
    states = {r["id"]: r["state"] for r in env.store.all("SELECT id, state FROM turns")}
    assert states == {"turn_" + "1" * 16: "open", "turn_" + "2" * 16: "failed"}


# -- rename journals -------------------------------------------------------------------------------


def tree(env: Env, name: str, *, state: str = "active", branch: str | None = None) -> str:
    """A worktree workspace with its checkout (identity recorded) and a journal to `b`-names."""
    wid = env.add(name, state, runtime="worktree", branch=branch or f"xum/{name}")
    env.worktree(wid)
    env.identify(wid)
    return wid


def settled_as(env: Env, wid: str, name: str, branch: str | None) -> None:
    """The rename journal of `wid` was settled with the workspace named `name` on `branch`, at
    that name's path, not flagged."""
    row = env.row(wid)
    assert (row.name, row.branch, row.path, row.interrupted) == (
        name,
        branch,
        env.path(name),
        False,
    )
    assert not env.has_journal(wid)


async def test_rename_rolls_back_when_only_the_old_checkout_exists(env: Env) -> None:
    # The branch not renamed yet (crash after the journal).
    plain = tree(env, "a")
    env.journal(plain, "b", from_branch="xum/a", to_branch="xum/b")
    # The branch already renamed, the checkout not moved (or moved back): the branch goes back.
    moved = tree(env, "c")
    env.journal(moved, "d", from_branch="xum/c", to_branch="xum/d")
    git(env.repo, "branch", "-m", "xum/c", "xum/d")

    report = await env.rec.run()

    for wid, name, branch in ((plain, "a", "xum/a"), (moved, "c", "xum/c")):
        settled_as(env, wid, name, branch)
    assert env.branches() == {"main", "xum/a", "xum/c"}
    assert report.actions == {"rename_rolled_back": 2}
    assert report.missing == []
    assert env.recovered() == {plain: "rename_rolled_back", moved: "rename_rolled_back"}


async def test_rename_rolls_forward_when_only_the_new_checkout_exists(env: Env) -> None:
    # Moved; the branch not renamed yet: it is renamed now.
    moved = tree(env, "a")
    new = env.journal(moved, "b", from_branch="xum/a", to_branch="xum/b")
    os.rename(env.path("a"), new)
    # Moved and the branch renamed: only the row is behind.
    both = tree(env, "c")
    new_both = env.journal(both, "d", from_branch="xum/c", to_branch="xum/d")
    os.rename(env.path("c"), new_both)
    git(env.repo, "branch", "-m", "xum/c", "xum/d")
    # The user's own branch, kept by the rename (from == to).
    own = tree(env, "e", branch="feature")
    new_own = env.journal(own, "f", from_branch="feature", to_branch="feature")
    os.rename(env.path("e"), new_own)
    # The directory runtime: no branch at all.
    plain = env.add("g", "active")
    env.directory(plain)
    env.identify(plain)
    new_plain = env.journal(plain, "h")
    os.rename(env.path("g"), new_plain)

    report = await env.rec.run()

    for wid, name, branch in (
        (moved, "b", "xum/b"),
        (both, "d", "xum/d"),
        (own, "f", "feature"),
        (plain, "h", None),
    ):
        settled_as(env, wid, name, branch)
    assert env.branches() == {"main", "xum/b", "xum/d", "feature"}
    assert report.actions == {"rename_rolled_forward": 4}
    # The moved checkouts are not reported missing: a journal's row is settled by the journal.
    assert report.missing == []
    assert set(env.recovered().values()) == {"rename_rolled_forward"}


async def test_archived_rename_follows_the_branch(env: Env) -> None:
    # Archived: nothing on disk but the branch.
    forward = env.add("a", "archived", runtime="worktree", branch="xum/a")
    git(env.repo, "branch", "xum/b")  # already renamed
    env.journal(forward, "b", from_branch="xum/a", to_branch="xum/b")
    back = env.add("c", "archived", runtime="worktree", branch="xum/c")
    git(env.repo, "branch", "xum/c")  # not renamed yet
    env.journal(back, "d", from_branch="xum/c", to_branch="xum/d")
    # No branch moves (the directory runtime): nothing on disk proves a move: back.
    still = env.add("e", "archived")
    env.journal(still, "f")

    report = await env.rec.run()

    assert (env.row(forward).name, env.row(forward).branch) == ("b", "xum/b")
    assert env.row(forward).path == env.path("b")
    assert (env.row(back).name, env.row(back).branch) == ("c", "xum/c")
    assert (env.row(still).name, env.row(still).path) == ("e", env.path("e"))
    assert not any(env.row(w).interrupted for w in (forward, back, still))
    assert not any(env.has_journal(w) for w in (forward, back, still))
    assert env.branches() == {"main", "xum/b", "xum/c"}
    assert report.actions == {"rename_rolled_forward": 1, "rename_rolled_back": 2}


async def test_renames_the_disk_does_not_prove_are_flagged(env: Env) -> None:
    # Both branches exist.
    both = tree(env, "a")
    env.journal(both, "b", from_branch="xum/a", to_branch="xum/b")
    git(env.repo, "branch", "xum/b")
    # Neither branch exists (archived: the branch is all there is).
    neither = env.add("c", "archived", runtime="worktree", branch="xum/c")
    env.journal(neither, "d", from_branch="xum/c", to_branch="xum/d")
    # The checkout at the old path, and something at the new one.
    squat_new = env.add("e", "active")
    env.directory(squat_new)
    env.identify(squat_new)
    env.journal(squat_new, "f").mkdir()
    # The checkout at the new path, and something at the old one.
    squat_old = env.add("g", "active")
    env.directory(squat_old)
    env.identify(squat_old)
    os.rename(env.path("g"), env.journal(squat_old, "h"))
    env.path("g").mkdir()
    # Neither path has the checkout.
    lost = env.add("i", "active")
    env.journal(lost, "j")
    # A journal of another incarnation, though the disk would prove a forward move.
    stale = env.add("k", "active")
    env.directory(stale)
    env.identify(stale)
    os.rename(env.path("k"), env.journal(stale, "l", incarnation="incprevious"))
    # The new name taken by another workspace meanwhile.
    taken = env.add("m", "active")
    env.directory(taken)
    env.identify(taken)
    os.rename(env.path("m"), env.journal(taken, "n"))
    taker = env.add("n", "archived")

    report = await env.rec.run()

    expect = {
        both: ("a", "branches 'xum/a' and 'xum/b' both exist"),
        neither: ("c", "branches 'xum/c' and 'xum/d' neither exist"),
        squat_new: ("e", "disk shows neither state"),
        squat_old: ("g", "disk shows neither state"),
        lost: ("i", "disk shows neither state"),
        stale: ("k", "rename journal does not match the workspace"),
        taken: ("m", "rename was interrupted; 'n' is taken"),
    }
    for wid, (name, words) in expect.items():
        row = env.row(wid)
        assert row.interrupted and row.interrupted_reason is not None, wid
        assert words in row.interrupted_reason, (wid, row.interrupted_reason)
        # The row keeps the old name and path; the journal is dropped (the flag says it all).
        assert (row.name, row.path) == (name, env.path(name))
        assert not env.has_journal(wid)
    assert env.row(taker).name == "n" and not env.row(taker).interrupted
    assert env.branches() == {"main", "xum/a", "xum/b"}
    assert report.actions == {"interrupted": len(expect)}
    assert sorted(report.interrupted) == sorted(expect)
    assert env.interrupted_events() == {w: env.row(w).interrupted_reason for w in expect}


async def test_a_journal_of_a_removed_row_is_dropped_and_the_rest_settled(env: Env) -> None:
    gone = env.add("x", "active")
    env.journal(gone, "y")
    with env.store.transaction():
        env.store.execute("DELETE FROM workspaces WHERE id = ?", (gone,))
    # Listed after the orphan journal (insertion order).
    wid = tree(env, "a")
    os.rename(env.path("a"), env.journal(wid, "b", from_branch="xum/a", to_branch="xum/b"))

    report = await env.rec.run()

    assert not env.has_journal(gone)
    assert env.row(wid).name == "b" and not env.has_journal(wid)
    assert report.actions == {"rename_rolled_forward": 1}


def lock_ref(env: Env, branch: str) -> None:
    """A ref lock left by a crashed git: `git branch -m` onto that name refuses."""
    lock = env.repo / ".git" / "refs" / "heads" / f"{branch}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text("")


def git_refusal(env: Env, src: str, dst: str) -> str:
    """What git says when it refuses `branch -m src dst` (its last 300 bytes, as reported)."""
    done = subprocess.run(
        ["git", "-C", str(env.repo), "branch", "-m", "--", src, dst],
        capture_output=True,
        env={**os.environ, **GIT_ENV, "LC_ALL": "C"},
        check=False,
    )
    assert done.returncode != 0
    return (done.stdout + done.stderr)[-300:].decode(errors="replace").strip()


async def test_a_branch_git_refuses_to_move_is_kept_where_it_is_and_flagged(env: Env) -> None:
    # Roll back: the checkout at the old path, the branch renamed, and its way back locked.
    back = tree(env, "a")
    env.journal(back, "b", from_branch="xum/a", to_branch="xum/b")
    git(env.repo, "branch", "-m", "xum/a", "xum/b")
    lock_ref(env, "xum/a")
    back_says = git_refusal(env, "xum/b", "xum/a")
    # Roll forward: the checkout moved, the branch not renamed, its new name locked.
    fwd = tree(env, "c")
    os.rename(env.path("c"), env.journal(fwd, "d", from_branch="xum/c", to_branch="xum/d"))
    lock_ref(env, "xum/d")
    fwd_says = git_refusal(env, "xum/c", "xum/d")
    assert len(back_says) > 200  # the lock message and its advice: the report keeps the end

    report = await env.rec.run()

    row = env.row(back)
    assert (row.name, row.path, row.branch, row.interrupted) == ("a", env.path("a"), "xum/b", True)
    assert row.interrupted_reason == (
        "rename was rolled back, but the branch 'xum/b' could not be renamed back to 'xum/a' "
        f"({back_says}); it keeps 'xum/b'"
    )
    row = env.row(fwd)
    assert (row.name, row.path, row.branch, row.interrupted) == ("d", env.path("d"), "xum/c", True)
    assert row.interrupted_reason == (
        "rename was rolled forward, but the branch 'xum/c' could not be renamed to 'xum/d' "
        f"({fwd_says}); it keeps 'xum/c'"
    )
    assert not env.has_journal(back) and not env.has_journal(fwd)
    assert env.branches() == {"main", "xum/b", "xum/c"}
    assert report.actions == {"interrupted": 2}


# -- settle_journal (workspace.keep) ---------------------------------------------------------------


async def test_settle_journal_settles_a_provable_rename_and_refuses_the_rest(env: Env) -> None:
    assert await env.rec.settle_journal(new_id()) is None  # no row, no journal
    no_journal = env.add("z", "active")
    assert await env.rec.settle_journal(no_journal) is None
    orphan = env.add("x", "active")
    env.journal(orphan, "y")
    with env.store.transaction():
        env.store.execute("DELETE FROM workspaces WHERE id = ?", (orphan,))
    assert await env.rec.settle_journal(orphan) is None

    fwd = tree(env, "a")
    os.rename(env.path("a"), env.journal(fwd, "b", from_branch="xum/a", to_branch="xum/b"))
    assert await env.rec.settle_journal(fwd) is None
    row = env.row(fwd)
    assert (row.name, row.branch, row.interrupted) == ("b", "xum/b", False)
    assert not env.has_journal(fwd)
    assert env.recovered() == {fwd: "rename_rolled_forward"}

    lost = env.add("c", "active", interrupted=True, reason="rename failed")
    env.journal(lost, "d")
    with pytest.raises(XumError) as refused:
        await env.rec.settle_journal(lost)
    assert refused.value.kind is ErrorKind.INVALID_STATE
    assert refused.value.message.startswith("cannot settle the interrupted rename of 'c': ")
    assert "disk shows neither state" in refused.value.message
    # Nothing written: the journal and the earlier flag stay.
    assert env.has_journal(lost)
    assert (env.row(lost).interrupted_reason, env.row(lost).version) == ("rename failed", 1)


async def test_settle_journal_returns_the_problem_it_flags(env: Env) -> None:
    fwd = tree(env, "a")
    os.rename(env.path("a"), env.journal(fwd, "b", from_branch="xum/a", to_branch="xum/b"))
    lock_ref(env, "xum/b")
    problem = await env.rec.settle_journal(fwd)
    assert problem is not None and problem == env.row(fwd).interrupted_reason
    assert problem.startswith("rename was rolled forward, but the branch 'xum/a'")


# -- settle_row (an operation that failed part-way) ------------------------------------------------


async def test_settle_row_takes_the_startup_decision_led_by_the_failure(env: Env) -> None:
    cause = "workspace.create failed: boom"
    assert env.rec.settle_row(new_id(), cause) is None
    active = env.add("act", "active")
    archived = env.add("arc", "archived")
    assert env.rec.settle_row(active, cause) is None
    assert env.rec.settle_row(archived, cause) is None
    flagged = env.add("flagged", "creating", interrupted=True, reason="earlier")
    assert env.rec.settle_row(flagged, cause) is None
    assert env.row(flagged).interrupted_reason == "earlier"
    assert env.events == []

    creating = env.add("creating", "creating")
    assert env.rec.settle_row(creating, cause) == "interrupted"
    assert env.row(creating).interrupted_reason == (
        f"{cause}: creation was interrupted before the checkout was made (remove it)"
    )
    # A roll-back that flags nothing keeps no reason.
    archiving = env.add("archiving", "archiving")
    env.directory(archiving)
    assert env.rec.settle_row(archiving, cause) == "archive_rolled_back"
    row = env.row(archiving)
    assert (row.state, row.interrupted, row.interrupted_reason) == ("active", False, None)
    assert env.recovered() == {creating: "interrupted", archiving: "archive_rolled_back"}
    assert env.interrupted_events() == {creating: env.row(creating).interrupted_reason}


async def test_settle_row_flags_a_row_with_a_rename_journal_and_keeps_the_journal(env: Env) -> None:
    cause = "workspace.rename failed: git refused"
    wid = tree(env, "a")
    env.journal(wid, "b", from_branch="xum/a", to_branch="xum/b")
    assert env.rec.settle_row(wid, cause) == "interrupted"
    row = env.row(wid)
    assert (row.state, row.name, row.interrupted) == ("active", "a", True)
    # Led by the cause once (the reason already starts with it: not prefixed again).
    assert row.interrupted_reason == (
        f"{cause}; the rename journal is kept: keep it (workspace.keep) or restart the daemon "
        "to settle it by what the disk shows"
    )
    assert env.has_journal(wid)
    # Already flagged: left as it is.
    assert env.rec.settle_row(wid, "another failure") is None
    assert env.row(wid).interrupted_reason == row.interrupted_reason


# -- saved copies of preserved files ---------------------------------------------------------------


def saved_copy(env: Env, wid: str, incarnation: str, files: dict[str, str]) -> Path:
    """A saved copy (ROOT/archive/<ws-id>) as archive writes it for the directory runtime."""
    store = env.app.paths.archive_store / wid
    for rel, text in files.items():
        (store / "content" / rel).parent.mkdir(parents=True, exist_ok=True)
        (store / "content" / rel).write_text(text)
    manifest = {"files": sorted(files), "incarnation": incarnation, "directory": True}
    (store / "manifest.json").write_text(json.dumps(manifest))
    return store


def active_with_copy(env: Env, name: str, files: dict[str, str]) -> tuple[str, Path]:
    """An active workspace (checkout with marker and identity) whose unarchive left the saved
    copy of an earlier incarnation."""
    wid = env.add(name, "active")
    env.directory(wid)
    env.identify(wid)
    return wid, saved_copy(env, wid, "incearlier", files)


def snapshot(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    return {
        str(p.relative_to(path)): (p.read_text() if p.is_file() else "<dir>")
        for p in sorted(path.rglob("*"))
    }


async def test_a_saved_copy_is_put_back_over_setup_and_then_deleted(env: Env) -> None:
    wid, store = active_with_copy(env, "a", {".env": "mine\n", "cfg/local.toml": "x = 1\n"})
    checkout = env.row(wid).path
    (checkout / ".env").write_text("written by setup\n")
    report = await env.rec.run()
    assert (checkout / ".env").read_text() == "mine\n"
    assert (checkout / "cfg" / "local.toml").read_text() == "x = 1\n"
    assert not store.exists()
    assert not list(env.app.paths.archive_store.iterdir())
    assert report.actions == {"preserved_settled": 1}


async def test_a_saved_copy_that_does_not_verify_is_set_aside(env: Env) -> None:
    wid, store = active_with_copy(env, "a", {".env": "mine\n", "cache": "a file\n"})
    checkout = env.row(wid).path
    (checkout / "cache").mkdir()  # a directory where the copy has a file: never deleted
    (checkout / "cache" / "keep.txt").write_text("setup's\n")
    content = snapshot(store)
    report = await env.rec.run()
    assert (checkout / ".env").read_text() == "mine\n"
    assert (checkout / "cache" / "keep.txt").read_text() == "setup's\n"
    assert not store.exists()
    kept = store.with_name(f"{wid}.incearlier")
    assert snapshot(kept) == content
    assert report.actions == {"preserved_settled": 1}


async def test_saved_copies_that_are_not_ours_to_settle_are_left_alone(env: Env) -> None:
    # An archive rolled back after it wrote the copy: the copy is of the current incarnation.
    current = env.add("current", "active")
    env.directory(current)
    env.identify(current)
    (env.row(current).path / ".env").write_text("newer\n")
    own = saved_copy(env, current, env.row(current).incarnation, {".env": "older\n"})
    # An archived workspace's copy (what unarchive restores).
    archived = env.add("archived", "archived")
    archived_copy = saved_copy(env, archived, env.row(archived).incarnation, {".env": "a\n"})
    # An active workspace whose checkout is not there (not ours: nothing to put back into).
    missing, missing_copy = active_with_copy(env, "missing", {".env": "m\n"})
    shutil.rmtree(env.row(missing).path)
    # A copy without a readable manifest.
    unreadable = env.add("unreadable", "active")
    env.directory(unreadable)
    env.identify(unreadable)
    broken = env.app.paths.archive_store / unreadable
    (broken / "content").mkdir(parents=True)
    (broken / "manifest.json").write_text("{not json")
    # A kept copy (set aside earlier), and a file that is not a copy.
    kept = env.app.paths.archive_store / f"{current}.incold"
    kept.mkdir()
    (kept / "manifest.json").write_text(json.dumps({"files": [], "incarnation": "incold"}))
    before = snapshot(env.app.paths.archive_store)

    report = await env.rec.run()

    assert snapshot(env.app.paths.archive_store) == before
    assert (env.row(current).path / ".env").read_text() == "newer\n"
    assert own.is_dir() and archived_copy.is_dir() and missing_copy.is_dir()
    assert "preserved_settled" not in report.actions


async def test_a_copy_that_cannot_be_put_back_is_left_and_the_pass_goes_on(env: Env) -> None:
    wid, store = active_with_copy(env, "a", {"sub/a.txt": "mine\n"})
    # A file where the copy needs a directory: putting it back fails (an OSError).
    (env.row(wid).path / "sub").write_text("a file\n")
    content = snapshot(store)
    report = await env.rec.run()
    assert snapshot(store) == content
    assert (env.row(wid).path / "sub").read_text() == "a file\n"
    assert "preserved_settled" not in report.actions


async def test_no_archive_store_or_a_file_in_its_place_is_nothing_to_settle(env: Env) -> None:
    wid = env.add("c", "creating")
    env.directory(wid)
    assert not env.app.paths.archive_store.exists()
    report = await env.rec.run()
    assert report.actions == {"completed": 1}
    env.app.paths.archive_store.write_text("not a directory\n")
    env.update(wid, state="creating")
    report = await env.rec.run()
    assert report.actions == {"completed": 1}
    assert env.app.paths.archive_store.read_text() == "not a directory\n"


async def test_copies_left_alone_do_not_stop_the_settling_of_the_others(env: Env) -> None:
    """Every kind of copy the pass skips, at least one listed before the one it settles (in
    the directory's own order: eight of each kind, then a target listed after one of each)."""
    store = env.app.paths.archive_store

    def archived_copy(n: int) -> str:
        wid = env.add(f"arch{n}", "archived")
        saved_copy(env, wid, env.row(wid).incarnation, {".env": "a\n"})
        return wid

    def same_incarnation(n: int) -> str:
        wid = env.add(f"same{n}", "active")
        env.directory(wid)
        env.identify(wid)
        saved_copy(env, wid, env.row(wid).incarnation, {".env": "older\n"})
        return wid

    def not_ours(n: int) -> str:
        wid, _ = active_with_copy(env, f"gone{n}", {".env": "m\n"})
        shutil.rmtree(env.row(wid).path)
        return wid

    def unreadable(n: int) -> str:
        wid = env.add(f"unread{n}", "active")
        (store / wid).mkdir(parents=True)
        return wid

    def fails(n: int) -> str:
        wid, _ = active_with_copy(env, f"fails{n}", {"sub/a.txt": "mine\n"})
        (env.row(wid).path / "sub").write_text("a file\n")
        return wid

    kinds = (archived_copy, same_incarnation, not_ours, unreadable, fails)
    made: dict[str, list[str]] = {make.__name__: [make(n) for n in range(8)] for make in kinds}
    # The directory's order (a hash order on ext4) is fixed per name: a target listed before
    # every copy of some kind is made into one more copy whose checkout is gone (it is then a
    # decoy like the others), and another target is tried. Making decoys after the target
    # instead failed by chance whenever the target hashed near the start.
    for attempt in range(40):
        target, target_copy = active_with_copy(env, f"target{attempt}", {".env": "mine\n"})
        with os.scandir(store) as entries:
            order = [e.name for e in entries]
        if all(min(map(order.index, mine)) < order.index(target) for mine in made.values()):
            break
        shutil.rmtree(env.row(target).path)
        made["not_ours"].append(target)
    else:
        pytest.fail("no target listed after a copy of each kind")
    (env.row(target).path / ".env").write_text("setup's\n")
    decoys = [w for mine in made.values() for w in mine]
    before = {w: snapshot(store / w) for w in decoys}

    report = await env.rec.run()

    assert (env.row(target).path / ".env").read_text() == "mine\n"
    assert not target_copy.exists()
    assert {w: snapshot(store / w) for w in decoys} == before
    assert report.actions == {"preserved_settled": 1}
