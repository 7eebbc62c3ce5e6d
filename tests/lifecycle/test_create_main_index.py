"""workspace.create leaves the main checkout's working-tree state alone: it runs no git command
that refreshes, rewrites or walks the main checkout's index against its files (on a 100,000-file
repository whose index stat data is stale, as after a copy, such a command re-hashes every file
once), and the main index file is the same file with the same bytes afterwards.

Git's own trace (trace2 events, in the daemon's environment) names every git process the create
starts; the main index is made stale first (every tracked file's mtime moved), so a refresh
anywhere would have to rewrite it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import add_project, create

# Commands that compare the index with the files (and may rewrite it), or maintain the
# repository: none belongs in a create.
REFRESHING = {
    "status",
    "update-index",
    "diff-index",
    "diff-files",
    "diff",
    "add",
    "commit",
    "gc",
    "maintenance",
    "commit-graph",
    "repack",
    "fetch",
}


def _index_identity(repo: Path) -> tuple[int, int, int, bytes]:
    index = repo / ".git" / "index"
    st = index.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns, index.read_bytes()


def _commands(trace: Path, start: int) -> list[tuple[list[str], str]]:
    """(argv, command name) of each git process that started after byte `start` of the trace."""
    argv: dict[str, list[str]] = {}
    names: dict[str, str] = {}
    with trace.open("rb") as f:
        f.seek(start)
        for line in f:
            event = json.loads(line)
            if event["event"] == "start":
                argv[event["sid"]] = event["argv"]
            elif event["event"] == "cmd_name":
                names[event["sid"]] = event["name"]
    return [(argv[sid], names.get(sid, "")) for sid in argv]


def test_create_runs_nothing_that_refreshes_the_main_checkout(tmp_short: Path) -> None:
    files = {f"d{i % 5}/f{i}.txt": f"file {i}\n" for i in range(60)}
    repo = make_repo(tmp_short / "repo", files)
    trace = tmp_short / "trace2.json"
    daemon = DaemonProcess(tmp_short / "root", env={"GIT_TRACE2_EVENT": str(trace)}).start()
    try:
        project = add_project(daemon, repo)
        # Stale stat data: every tracked file looks changed to git until it re-hashes it.
        later = 1_900_000_000
        for name in files:
            os.utime(repo / name, (later, later))
        before = _index_identity(repo)
        start = trace.stat().st_size if trace.exists() else 0
        made = create(daemon, project["id"], "one")
        assert Path(made["workspace"]["path"], "d0", "f0.txt").read_text() == "file 0\n"
        commands = _commands(trace, start)
        assert any(name == "worktree" for _, name in commands), commands  # the trace is read
        ran = [argv for argv, name in commands if name in REFRESHING]
        assert ran == [], f"create ran {ran}"
        assert _index_identity(repo) == before
        # The staleness was real: git itself still sees every file as possibly changed.
        assert git(repo, "diff-files", "--name-only").strip() != ""
    finally:
        daemon.terminate()
