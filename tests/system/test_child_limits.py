"""Children start with the descriptor soft limit the daemon started with, not the one it raised
for itself (fdlimits.child_soft): a supervised program, a setup script and a git hook each read
their own RLIMIT_NOFILE. Real parts: a real xumd started under `prlimit` with a low soft limit,
real git running a real post-checkout hook, real supervised processes (with and without a run
cgroup)."""

from __future__ import annotations

import ast
import json
import resource
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cgroups import delegated_cgroup
from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import commit_config, make_repo
from tests.support.lifecycle_helpers import add_project, create

PRLIMIT = shutil.which("prlimit")
pytestmark = pytest.mark.skipif(PRLIMIT is None, reason="prlimit (util-linux) is not installed")

SOFT = 512
"""The soft limit the daemon is started with; it raises its own to the hard limit."""

READ_LIMIT = "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))"


def _hard() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    hard = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if hard <= SOFT:
        pytest.skip(f"the hard limit ({hard}) leaves nothing to raise")
    return min(hard, 4096)


def _daemon(root: Path, hard: int, config: str = "") -> DaemonProcess:
    assert PRLIMIT is not None
    write_config(root, config)
    return DaemonProcess(root, launcher=[PRLIMIT, f"--nofile={SOFT}:{hard}", "--"])


def _limits(text: str) -> tuple[int, int]:
    value = ast.literal_eval(text.strip().splitlines()[-1])
    assert isinstance(value, tuple) and len(value) == 2, text
    return int(value[0]), int(value[1])


def _reader(out: Path) -> str:
    """A shell line that writes its own (soft, hard) to `out`."""
    return f"{sys.executable} -c {json.dumps(READ_LIMIT)} > {out}"


def _supervised(daemon: DaemonProcess, wid: str) -> tuple[int, int]:
    params: dict[str, Any] = {
        "workspace_id": wid,
        "kind": "exec",
        "argv": [sys.executable, "-c", READ_LIMIT],
    }
    proc = daemon.call("process.spawn", params)["process"]
    done = daemon.call("process.wait", {"process_id": proc["id"], "timeout_s": 20})["process"]
    assert done["exit"]["code"] == 0, done
    out = daemon.call("process.output", {"process_id": proc["id"], "wait_s": 1})
    return _limits(out["data"])


@pytest.fixture
def run_cgroups() -> Iterator[Path]:
    """A writable cgroup v2 directory standing in for a delegated one: with it, scripts and
    supervised programs start through the cgroup join's shim instead of `prlimit`."""
    with delegated_cgroup() as base:
        yield base


@pytest.mark.parametrize("cgroup", ["none", "runs", "lost"])
def test_children_get_the_soft_limit_the_daemon_started_with(
    tmp_short: Path, root: Path, request: pytest.FixtureRequest, cgroup: str
) -> None:
    """`none`: commands start through prlimit; `runs`: through the cgroup join's shim; `lost`:
    the configured cgroup went away, so commands start without a cgroup (and its shim)."""
    hard = _hard()
    config = ""
    base: Path | None = None
    if cgroup != "none":
        base = request.getfixturevalue("run_cgroups")
        config = f'[processes]\ncgroup = "{base}"\n'

    hook_out, setup_out = tmp_short / "hook", tmp_short / "setup"
    repo = make_repo(tmp_short / "repo", {"README.md": "hi\n"})
    commit_config(repo, f"[scripts]\nsetup = [{json.dumps(_reader(setup_out))}]\n", "setup")
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\n{_reader(hook_out)}\n")
    hook.chmod(0o755)
    daemon = _daemon(root, hard, config).start()
    try:
        status = daemon.call("daemon.status")["details"]
        assert (status["containment"]["cgroup"] is not None) == (base is not None)
        if cgroup == "lost":
            assert base is not None
            base.rmdir()  # empty: nothing has run yet
        fds = status["fds"]
        assert fds["initial_soft"] == SOFT and fds["soft"] == hard, "the daemon's own is raised"
        project = add_project(daemon, repo)
        daemon.call("project.trust", {"project_id": project["id"]})
        ws = create(daemon, project["id"], "w1")["workspace"]
        # git's post-checkout hook (git worktree add runs it) and the trusted setup script.
        assert _limits(hook_out.read_text()) == (SOFT, hard)
        assert _limits(setup_out.read_text()) == (SOFT, hard)
        assert _supervised(daemon, ws["id"]) == (SOFT, hard)
        runs_without = daemon.call("daemon.status")["details"]["containment"]["runs_without_cgroup"]
        assert (runs_without > 0) == (cgroup == "lost")
    finally:
        daemon.close()


def test_a_daemon_that_raised_nothing_leaves_the_limit_as_it_is(
    tmp_short: Path, root: Path
) -> None:
    # Soft already at the hard limit: nothing to put back, children inherit it unchanged.
    hard = _hard()
    assert PRLIMIT is not None
    write_config(root, "")
    daemon = DaemonProcess(root, launcher=[PRLIMIT, f"--nofile={hard}:{hard}", "--"]).start()
    try:
        repo = make_repo(tmp_short / "repo", {"README.md": "hi\n"})
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "w1")["workspace"]
        assert _supervised(daemon, ws["id"]) == (hard, hard)
    finally:
        daemon.close()
