"""Audit: removing a project never strands a teardown it still owes.

A teardown runs only under the project's trusted config (the trust lives on the project row). If
a workspace's teardown fails while its project is removed and the project row went with it, no
retry can ever run that teardown again (nothing is trusted any more, and a project that is gone
cannot be trusted): the obligation stays pending forever and the checkout is never freed. The
project stays (cleanup_pending) until its owed teardowns are done; then it is removed.
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
    repo = make_repo(tmp_short / "repo", {"README.md": "hi\n"})
    commit_scripts(repo, setup=["true"], teardown=failing_teardown(ctl))
    return repo


@pytest.fixture
def started(root: Path, repo: Path) -> Iterator[tuple[DaemonProcess, dict[str, Any]]]:
    with trusted_daemon(root, repo, SLOW_RETRY) as running:
        yield running


def test_project_remove_keeps_the_project_while_a_teardown_is_owed(
    started: tuple[DaemonProcess, dict[str, Any]], ctl: Path
) -> None:
    daemon, project = started
    ws = create(daemon, project["id"], "w")["workspace"]
    path = Path(ws["path"])

    err = rpc_error(daemon, "project.remove", {"project_id": project["id"]})
    assert err.kind == "cleanup_pending", err
    assert daemon.call("project.get", {"project_id": project["id"]})["project"]["id"]
    assert path.is_dir(), "the checkout waits for its teardown"

    (ctl / "ok").touch()
    retried = daemon.call("cleanup.retry", {"workspace_id": ws["id"]})
    assert retried["workspaces"][ws["id"]]["status"] == "completed", retried
    assert not path.exists()
    removed = daemon.call("project.remove", {"project_id": project["id"]})
    assert removed["removed"] is True
    assert rpc_error(daemon, "project.get", {"project_id": project["id"]}).kind == "not_found"
