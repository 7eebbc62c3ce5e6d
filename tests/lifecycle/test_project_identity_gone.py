"""A project is known by its path and by its directory's inode. When the recorded path is gone,
a directory with that inode elsewhere is either the same one moved, or a deleted one's inode
handed to a new directory (found: a test's repository deleted at its end gave its inode to the
next test's). The refusal says the old path is gone and what to do in either case."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project, rpc_error


def test_a_moved_project_directory_is_refused_naming_the_gone_path(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    one = make_repo(tmp_short / "one")
    add_project(daemon, one)
    err = rpc_error(daemon, "project.add", {"path": str(one), "name": "twin"})
    assert err.kind == "conflict" and "is gone" not in err.message, err  # still there
    moved = tmp_short / "two"
    os.rename(one, moved)
    err = rpc_error(daemon, "project.add", {"path": str(moved)})
    assert err.kind == "conflict", err
    assert f"that project's path {one} is gone" in err.message, err.message
    assert "xum project rm one" in err.message
