"""`workspace.setup` (a setup rerun) and the workspace's running processes.

A rerun is not a structural change (the contract's quiescence rule names rename, remove,
archive and unarchive): it neither waits for nor stops the processes already running in the
workspace, as the user running the setup in a terminal would not. It holds the workspace's
exclusive reservation, so nothing new starts there meanwhile: a process spawn and an external
lease are refused `busy`, naming the setup. A real daemon, a real script, a real process.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import add_project, create, rpc_error
from tests.support.wait import until


def test_a_rerun_runs_beside_the_running_processes_and_admits_no_new_one(
    tmp_short: Path,
) -> None:
    block, started = tmp_short / "block", tmp_short / "started"
    repo = make_repo(tmp_short / "repo")
    (repo / ".xum").mkdir()
    setup = f"touch {started}; while [ -e {block} ]; do sleep 0.05; done"
    (repo / ".xum" / "config.toml").write_text(f'[scripts]\nsetup = ["{setup}"]\n')
    git(repo, "add", ".xum")
    git(repo, "commit", "-q", "-m", "setup")
    daemon = DaemonProcess(tmp_short / "root").start()
    worker: threading.Thread | None = None
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "a")["workspace"]  # setup skipped: untrusted
        daemon.call("project.trust", {"project_id": project["id"]})
        spawn = {"workspace_id": ws["id"], "kind": "terminal", "argv": ["sleep", "60"]}
        running = daemon.call("process.spawn", spawn)["process"]
        block.touch()
        answer: dict[str, Any] = {}

        def rerun() -> None:
            answer.update(daemon.call("workspace.setup", {"workspace_id": ws["id"]}))

        worker = threading.Thread(target=rerun, daemon=True)
        worker.start()
        until(started.exists, message="the rerun setup to start")
        # It did not wait for the running process, nor stop it.
        got = daemon.call("process.get", {"process_id": running["id"]})["process"]
        assert got["state"] == "running", got
        # Nothing new starts in the workspace while it runs.
        refused = rpc_error(daemon, "process.spawn", spawn)
        assert refused.kind == "busy" and "setup" in str(refused), refused
        lease = {"workspace_id": ws["id"], "kind": "editor", "pid": running["pid"]}
        refused = rpc_error(daemon, "lease.acquire", lease)
        assert refused.kind == "busy" and "setup" in str(refused), refused
        block.unlink()
        worker.join(60)
        assert not worker.is_alive()
        assert answer["setup"]["status"] == "ok", answer
        # Once it ended, the workspace admits again.
        again = daemon.call("process.spawn", spawn)["process"]
        for proc in (running, again):
            daemon.call("process.stop", {"process_id": proc["id"], "grace_s": 1})
    finally:
        block.unlink(missing_ok=True)
        if worker is not None:
            worker.join(60)
        daemon.close()
