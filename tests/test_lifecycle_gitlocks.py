"""Stale git lock files: cleared only when provably stale, reported with the path."""

from __future__ import annotations

import os
import time
from pathlib import Path

from xumd.lifecycle import gitlocks

from tests.lifecycle_helpers import add_project, create
from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import make_repo


def _age(path: Path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_clear_stale_only_old_and_unheld(tmp_short: Path) -> None:
    repo = make_repo(tmp_short / "repo")
    git_dir = repo / ".git"
    old_free = git_dir / "index.lock"
    old_free.write_text("")
    _age(old_free, 3600)
    young = git_dir / "config.lock"
    young.write_text("")
    held = git_dir / "packed-refs.lock"
    held.write_text("")
    _age(held, 3600)
    ref_lock = git_dir / "refs" / "heads" / "main.lock"
    ref_lock.write_text("")
    _age(ref_lock, 3600)
    with open(held) as holder:  # a live process (this one) has it open
        report = gitlocks.clear_stale(git_dir)
        assert sorted(report.cleared) == sorted([str(old_free), str(ref_lock)])
        live = {entry["path"]: entry for entry in report.live}
        assert live[str(held)]["pid"] == os.getpid()
        assert live[str(young)]["pid"] is None
        assert held.exists() and young.exists()
        assert holder.read() == ""
    assert not old_free.exists() and not ref_lock.exists()


def test_create_clears_a_stale_index_lock_and_reports_it(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    repo = make_repo(tmp_short / "repo")
    project = add_project(daemon, repo)
    lock = repo / ".git" / "index.lock"
    lock.write_text("")
    _age(lock, 3600)  # left by a SIGKILLed git long ago; nobody holds it
    result = create(daemon, project["id"], "after-crash")
    assert result["workspace"]["state"] == "active"
    assert result["cleared_locks"] == [str(lock)]
    assert not lock.exists()
