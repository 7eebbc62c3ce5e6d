"""Deadlines that fail closed, on a real daemon: a quiescence probe that does not
finish means busy (never "nobody holds it"), and a git that hangs is killed at the daemon's git
deadline (never waited on forever). Each was seen to fail with the guard disabled."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import git
from tests.support.lifecycle_helpers import add_project, create, rpc_error, worktrees
from tests.support.procs import alive, identify
from tests.support.wait import until


def test_a_probe_that_does_not_finish_means_busy(
    root: Path, repo: Path, started_procs: list[subprocess.Popen[bytes]]
) -> None:
    """The cwd/open-file scan gets a deadline it cannot meet: archive and remove refuse `busy`
    naming the unfinished probe, while a process really works in the checkout."""
    write_config(root, "[processes]\nprobe_deadline_s = 0.000001\n")
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "a")["workspace"]
        started_procs.append(subprocess.Popen(["sleep", "300"], cwd=ws["path"]))
        for method, extra in (("workspace.archive", {}), ("workspace.remove", {"force": True})):
            err = rpc_error(daemon, method, {"workspace_id": ws["id"], **extra})
            assert err.data.get("kind") == "busy", (method, err)
            kinds = [h["kind"] for h in err.data.get("holders", [])]
            assert kinds == ["probe"], (method, err.data)
            assert "did not finish" in str(err), err
        got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
        assert got["state"] == "active" and Path(ws["path"]).is_dir()
    finally:
        daemon.close()


def test_a_probe_in_time_names_the_process(
    root: Path, repo: Path, started_procs: list[subprocess.Popen[bytes]]
) -> None:
    """The counterpart with the default deadline: the same probe finishes and names the pid (so
    the test above fails for the deadline, not for the set-up)."""
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "a")["workspace"]
        sleeper = subprocess.Popen(["sleep", "300"], cwd=ws["path"])
        started_procs.append(sleeper)
        err = rpc_error(daemon, "workspace.archive", {"workspace_id": ws["id"]})
        assert err.data.get("kind") == "busy"
        assert [(h["kind"], h["pid"]) for h in err.data["holders"]] == [("process", sleeper.pid)]
    finally:
        daemon.close()


HANG = 120
"""How long the hook hangs: far beyond the test's bound, so only the git deadline can end it."""


def test_a_hung_git_is_killed_at_the_git_deadline(root: Path, repo: Path, tmp_short: Path) -> None:
    """`git worktree add` runs the repository's post-checkout hook, which hangs (a real git, a
    real hook). With `git_timeout_s = 2` the create fails `timeout` within seconds, the hook's
    whole tree is gone, and nothing of the create is left."""
    pidfile = tmp_short / "hook.pid"
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\nsleep {HANG} &\necho $! > {pidfile}\nwait\n")
    hook.chmod(0o755)
    write_config(root, "git_timeout_s = 2.0\nstop_grace_s = 0.5\n")
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        before = set(worktrees(repo))
        # Without git's deadline the hook hangs for HANG s and the call never answers
        # `timeout`: the kind and the killed sleep below are what the deadline does.
        err = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "a"})
        assert err.data.get("kind") == "timeout", err
        assert "git worktree add" in str(err), err
        assert pidfile.exists(), "the hook never ran"
        sleeper = identify(int(pidfile.read_text()))
        until(lambda: not alive(sleeper), 10, message="the hook's sleep killed")
        assert set(worktrees(repo)) == before
        assert daemon.call("workspace.list", {})["workspaces"] == []
        assert not git(repo, "branch", "--list", "xum/a").strip()
    finally:
        daemon.close()
