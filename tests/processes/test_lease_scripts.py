"""Setup scripts hold a durable use lease with their child's pid while they run."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import add_project, create
from tests.support.wait import until


def test_setup_run_holds_a_lease_naming_its_pid(daemon: DaemonProcess, tmp_short: Path) -> None:
    ctl = tmp_short / "ctl"
    ctl.mkdir()
    repo = make_repo(tmp_short / "repo")
    script = (
        f"echo $$ > {ctl}/pid; i=0; "
        f"while [ ! -f {ctl}/go ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done"
    )
    (repo / ".xum").mkdir()
    (repo / ".xum" / "config.toml").write_text(f"[scripts]\nsetup = [{json.dumps(script)}]\n")
    git(repo, "add", ".xum/config.toml")
    git(repo, "commit", "-q", "-m", "setup")
    project = add_project(daemon, repo)
    daemon.call("project.trust", {"project_id": project["id"]})
    created: list[dict[str, Any]] = []
    worker = threading.Thread(target=lambda: created.append(create(daemon, project["id"], "s")))
    worker.start()
    try:
        until(lambda: (ctl / "pid").exists() and (ctl / "pid").read_text().strip())
        pid = int((ctl / "pid").read_text())
        leases = until(lambda: daemon.call("lease.list")["leases"])
        assert [(x["kind"], x["pid"], x["label"]) for x in leases] == [
            ("setup", pid, "setup script")
        ]
    finally:
        (ctl / "go").write_text("")
        worker.join(30)
    assert created and created[0]["setup"]["status"] == "ok"
    assert daemon.call("lease.list")["leases"] == []
