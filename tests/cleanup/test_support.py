"""Helpers for the cleanup tests (no tests here): a real Store and App on a temp root, real
directories and git worktrees with the real incarnation markers, a fake clock, and a teardown that
runs a real shell command (via procutil.run_command, as the lifecycle ScriptRunner does)."""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xumd.app import App
from xumd.base.config import CleanupConfig, DaemonConfig
from xumd.base.paths import RootPaths
from xumd.checkouts.exclusion import DirectoryExclusion
from xumd.checkouts.marker import Marker, write_directory_marker
from xumd.cleanup.obligations import ObligationRow
from xumd.cleanup.service import CleanupService
from xumd.cleanup.steps import Outcome, UnsavedWork, teardown_outcome
from xumd.lifecycle import rows, wsenv
from xumd.store import Store
from xumd.system.git import Git
from xumd.system.procutil import run_command

from tests.support.gitrepo import git, make_repo


class FakeClock:
    """Wall and monotonic time move only when the test says so."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        """Returns once the test has advanced the clock far enough (never a hot loop)."""
        import anyio

        target = self.now + seconds
        while self.now < target:
            await anyio.sleep(0.01)

    def advance(self, seconds: float) -> None:
        self.now += seconds


def ws_id(tag: str = "") -> str:
    return "ws_" + (tag.encode().hex() + secrets.token_hex(8))[:16]


def make_app(root: Path, **cleanup: Any) -> App:
    root.mkdir(parents=True, exist_ok=True)
    paths = RootPaths(root)
    store = Store(paths.database)
    store.migrate()
    config = DaemonConfig(cleanup=CleanupConfig(**cleanup))
    return App(paths, config, store)


def add_project(app: App, path: Path) -> str:
    pid = "prj_" + secrets.token_hex(8)
    st = os.stat(path)
    now = time.time()
    with app.store.transaction():
        app.store.execute(
            "INSERT INTO projects (id, name, path, dev, ino, kind, created_at, updated_at) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (pid, f"p{pid[-6:]}", str(path), st.st_dev, st.st_ino, "git", now, now),
        )
    return pid


def add_workspace(
    app: App, project_id: str, wid: str, path: Path, incarnation: str, state: str = "archived"
) -> None:
    now = time.time()
    with app.store.transaction():
        app.store.execute(
            "INSERT INTO workspaces (id, project_id, name, runtime, path, state, incarnation, "
            "created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?)",
            (wid, project_id, f"n{wid[-6:]}", "worktree", str(path), state, incarnation, now, now),
        )


def set_workspace(app: App, wid: str, **changes: Any) -> None:
    sets = ", ".join(f"{k} = ?" for k in changes)
    with app.store.transaction():
        app.store.execute(f"UPDATE workspaces SET {sets} WHERE id = ?", (*changes.values(), wid))


def make_dir_checkout(path: Path, wid: str, incarnation: str, files: int = 3) -> tuple[int, int]:
    path.mkdir(parents=True)
    write_directory_marker(path, Marker(wid, incarnation))
    for i in range(files):
        (path / f"f{i}.txt").write_text("x" * 100)
    st = os.stat(path)
    return st.st_dev, st.st_ino


def make_worktree(repo: Path, path: Path, wid: str, incarnation: str) -> tuple[int, int]:
    git(
        repo,
        "worktree",
        "add",
        "-q",
        "--lock",
        "--reason",
        Marker(wid, incarnation).reason(),
        "-b",
        f"b-{wid}",
        str(path),
    )
    (path / "node_modules").mkdir()
    (path / "node_modules" / "big.js").write_text("y" * 5000)
    st = os.stat(path)
    return st.st_dev, st.st_ino


@dataclass
class ScriptTeardown:
    """A teardown that runs `script` with /bin/sh in the checkout (real processes)."""

    script: str
    timeout_s: float = 30.0
    grace_s: float = 0.5
    calls: list[str] = field(default_factory=list)

    async def __call__(self, ob: ObligationRow, cwd: Path) -> Outcome:
        self.calls.append(ob.workspace_id)
        result = await run_command(
            ["/bin/sh", "-c", self.script],
            cwd=cwd,
            env={**os.environ, "XUM_WORKSPACE_ID": ob.workspace_id},
            timeout_s=self.timeout_s,
            grace_s=self.grace_s,
        )
        status = "ok" if result.ok else ("timeout" if result.timed_out else "failed")
        return teardown_outcome(
            status, None if result.ok else result.describe(), result.output.text()
        )


@dataclass
class World:
    app: App
    service: CleanupService
    clock: FakeClock
    root: Path
    repo: Path
    project_id: str

    def plan(
        self,
        wid: str,
        path: Path,
        incarnation: str,
        ident: tuple[int, int],
        *,
        teardown: bool = True,
        runtime: str = "directory",
    ) -> list[str]:
        with self.app.store.transaction():
            return self.service.plan_checkout_removal(
                workspace_id=wid,
                project_id=self.project_id,
                incarnation=incarnation,
                runtime=runtime,
                repo_path=self.repo,
                checkout=path,
                dev=ident[0],
                ino=ident[1],
                teardown=teardown,
            )

    def states(self, wid: str) -> dict[str, str]:
        return {o.kind: o.state for o in self.service.obligations.for_workspace(wid)}


class NothingUnsaved:
    """The lifecycle's comparison of a lingering checkout with its archive, for worlds that
    have no archive to compare with: these test the cleanup's own steps, and say so here
    rather than through a default in the daemon. The comparison itself is tested against a
    real daemon (tests/cleanup/test_lingering_work.py)."""

    async def unsaved_files(self, ob: ObligationRow) -> list[str]:
        return []


class NoTeardownPlanned:
    """The teardown of a world whose obligations plan none: running it is the test's error."""

    async def __call__(self, ob: ObligationRow, cwd: Path) -> Outcome:
        raise AssertionError(f"{ob.id}: a teardown ran in a world that plans none")


def make_world(
    base: Path,
    teardown: Any,
    *,
    clock: FakeClock | None = None,
    unsaved: UnsavedWork | None = None,
    **cleanup: Any,
) -> World:
    import random

    app = make_app(base / "root", **cleanup)
    repo = make_repo(base / "repo")
    clock = clock or FakeClock()
    service = CleanupService(
        app,
        clock=clock,
        rng=random.Random(7),
        teardown=teardown or NoTeardownPlanned(),
        unsaved=unsaved or NothingUnsaved(),
        teardown_env=lambda workspace_id: wsenv.frozen(app.store, workspace_id),
        remember_cleanup=lambda workspace_id, status: rows.set_last_cleanup(
            app.store, workspace_id, status
        ),
        records=rows.StoreWorkspaceRecords(app.store),
        git=Git(timeout_s=app.config.git_timeout_s),
        directories=DirectoryExclusion(wait_s=app.config.cleanup.step_timeout_s),
    )
    app.provide(service)
    return World(app, service, clock, base / "root", repo, add_project(app, repo))
