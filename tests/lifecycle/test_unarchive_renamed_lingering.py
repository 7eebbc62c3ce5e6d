"""Audit: unarchive never trashes work made in a lingering archived checkout, even after the
archived workspace was renamed.

An archive whose teardown fails leaves the checkout at its old path (cleanup pending). Renaming
the archived workspace changes only the row's path and name; the lingering checkout (and its
obligations) stay at the old path. Unarchive runs that pending cleanup forced; it must first look
for work the archive does not hold in the checkout the cleanup would trash (the old path), not
at the row's new path (where nothing exists yet).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import (
    commit_scripts,
    create,
    failing_teardown,
    rpc_error,
    trusted_daemon,
)

SLOW_RETRY = "[cleanup]\nbackoff_initial_s = 120\nbackoff_max_s = 240\nbackoff_jitter = 0\n"


@pytest.fixture
def repo(tmp_short: Path, ctl: Path) -> Path:
    repo = make_repo(tmp_short / "repo", {"README.md": "hi\n", "src/a.txt": "a1\n"})
    commit_scripts(repo, teardown=failing_teardown(ctl))
    return repo


@pytest.fixture
def started(root: Path, repo: Path) -> Iterator[tuple[DaemonProcess, dict[str, Any]]]:
    with trusted_daemon(root, repo, SLOW_RETRY) as running:
        yield running


@pytest.mark.parametrize("runtime", ["worktree", "directory"])
def test_unarchive_after_rename_never_trashes_work_in_the_lingering_checkout(
    started: tuple[DaemonProcess, dict[str, Any]], ctl: Path, runtime: str
) -> None:
    daemon, project = started
    ws = create(daemon, project["id"], "old", runtime=runtime)["workspace"]
    old_path = Path(ws["path"])
    (old_path / "notes.txt").write_text("archived work\n")
    archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert archived["cleanup"]["status"] == "pending", archived["cleanup"]
    assert old_path.is_dir(), "the checkout waits for its teardown"
    (old_path / "late.txt").write_text("written after the archive\n")

    renamed = daemon.call("workspace.rename", {"workspace_id": ws["id"], "name": "new"})
    assert renamed["workspace"]["path"] != str(old_path)
    (ctl / "ok").touch()  # the teardown would pass now: only the safety check can refuse

    err = rpc_error(daemon, "workspace.unarchive", {"workspace_id": ws["id"]})
    assert err.kind == "not_safe", err
    assert "late.txt" in err.message
    assert (old_path / "late.txt").read_text() == "written after the archive\n"
    got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert got["state"] == "archived" and got["incarnation"] == ws["incarnation"]

    # Moved away by the user: the rest is what the archive holds, so unarchive proceeds.
    (old_path / "late.txt").unlink()
    restored = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})["workspace"]
    assert restored["state"] == "active" and restored["name"] == "new"
    assert (Path(restored["path"]) / "notes.txt").read_text() == "archived work\n"
