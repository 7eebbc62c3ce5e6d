"""project.remove is all or nothing as far as a check can tell (docs/RELIABILITY.md,
"atomicity across objects"): every workspace is reserved (exclusive, all held together) and
checked before any is removed; one refusal (a holder, unsaved work, another operation in
progress) removes nothing and names every refusal and every holder."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from xum_client.errors import XumRpcError

from tests.support.daemon import DaemonProcess, short_tmpdir
from tests.support.gitrepo import make_repo
from tests.support.holds import hold_env, release, wait_held
from tests.support.lifecycle_helpers import (
    add_project,
    commit_scripts,
    create,
    failing_teardown,
    rpc_error,
    trusted_daemon,
)


@pytest.fixture
def repo(tmp_short: Path) -> Path:
    return make_repo(tmp_short / "repo")


def states(daemon: DaemonProcess) -> dict[str, str]:
    return {w["name"]: w["state"] for w in daemon.call("workspace.list", {})["workspaces"]}


def four(daemon: DaemonProcess, project_id: str) -> dict[str, dict[str, Any]]:
    """The tester's setup: four workspaces, one of them archived."""
    made = {name: create(daemon, project_id, name)["workspace"] for name in "abcd"}
    daemon.call("workspace.archive", {"workspace_id": made["b"]["id"]})
    return made


def test_one_busy_workspace_removes_nothing(daemon: DaemonProcess, repo: Path) -> None:
    project = add_project(daemon, repo)
    made = four(daemon, project["id"])
    agent = daemon.call(
        "process.spawn",
        {"workspace_id": made["c"]["id"], "kind": "agent", "argv": ["sleep", "60"]},
    )["process"]
    before = states(daemon)
    err = rpc_error(daemon, "project.remove", {"project_id": project["id"], "force": True})
    assert err.kind == "busy", err
    assert f"agent in pid {agent['pid']}" in str(err) and "'c'" in str(err)
    assert [(h["kind"], h["pid"], h["workspace"]) for h in err.data["holders"]] == [
        ("agent", agent["pid"], "c")
    ]
    assert [(w["name"], w["error"]["kind"]) for w in err.data["workspaces"]] == [("c", "busy")]
    # Nothing was removed: the rows, their states and their checkouts are all there.
    assert (
        states(daemon) == before == {"a": "active", "b": "archived", "c": "active", "d": "active"}
    )
    for name in "acd":
        assert Path(made[name]["path"]).is_dir()
    assert daemon.call("project.get", {"project_id": project["id"]})["project"]["id"]
    # Once the agent is stopped, the project goes with all four.
    daemon.call("process.stop", {"process_id": agent["id"]})
    done = daemon.call("project.remove", {"project_id": project["id"], "force": True})
    assert done["removed"] is True
    assert sorted(w["name"] for w in done["workspaces"] if w["ok"]) == ["a", "b", "c", "d"]
    assert daemon.call("workspace.list", {})["workspaces"] == []


def test_every_holder_and_refusal_is_named(
    daemon: DaemonProcess, repo: Path, started_procs: list[subprocess.Popen[bytes]]
) -> None:
    project = add_project(daemon, repo)
    made = four(daemon, project["id"])
    term = daemon.call(
        "process.spawn",
        {"workspace_id": made["a"]["id"], "kind": "terminal", "argv": ["sleep", "60"]},
    )["process"]
    editor = subprocess.Popen(["sleep", "60"], start_new_session=True)
    started_procs.append(editor)
    daemon.call(
        "lease.acquire",
        {"workspace_id": made["d"]["id"], "kind": "editor", "pid": editor.pid, "label": "vim"},
    )
    (Path(made["c"]["path"]) / "unsaved.txt").write_text("work\n")  # not_safe without force
    before = states(daemon)
    err = rpc_error(daemon, "project.remove", {"project_id": project["id"]})
    assert err.kind == "busy", err  # busy wins: the caller first has to free the holders
    assert {(h["workspace"], h["kind"], h["pid"]) for h in err.data["holders"]} == {
        ("a", "terminal", term["pid"]),
        ("d", "editor", editor.pid),
    }
    refused = {w["name"]: w["error"]["kind"] for w in err.data["workspaces"]}
    assert refused == {"a": "busy", "c": "not_safe", "d": "busy"}
    assert states(daemon) == before
    assert (Path(made["c"]["path"]) / "unsaved.txt").read_text() == "work\n"


def test_unsaved_work_alone_removes_nothing(daemon: DaemonProcess, repo: Path) -> None:
    project = add_project(daemon, repo)
    made = four(daemon, project["id"])
    (Path(made["d"]["path"]) / "unsaved.txt").write_text("work\n")
    err = rpc_error(daemon, "project.remove", {"project_id": project["id"]})
    assert err.kind == "not_safe" and err.data["holders"] == []
    assert [w["name"] for w in err.data["workspaces"]] == ["d"]
    assert states(daemon) == {"a": "active", "b": "archived", "c": "active", "d": "active"}


def test_a_structural_operation_in_progress_removes_nothing() -> None:
    """An archive of one workspace is under way (held after its intent): the project's removal
    cannot reserve that workspace, so it refuses at once and removes none of the others."""
    base = short_tmpdir("xump-")
    point, holds = "workspace.archive.hold", base / "holds"
    daemon = DaemonProcess(base / "root", env=hold_env(point, holds)).start()
    try:
        project = add_project(daemon, make_repo(base / "repo"))
        made = {name: create(daemon, project["id"], name)["workspace"] for name in "abc"}
        out: dict[str, Any] = {}

        def archive() -> None:
            try:
                out["result"] = daemon.call("workspace.archive", {"workspace_id": made["b"]["id"]})
            except XumRpcError as exc:
                out["error"] = exc

        thread = threading.Thread(target=archive, daemon=True)
        thread.start()
        wait_held(point, holds)
        err = rpc_error(daemon, "project.remove", {"project_id": project["id"], "force": True})
        assert err.kind == "busy", err
        assert [(w["name"], w["error"]["operation"]) for w in err.data["workspaces"]] == [
            ("b", "archive")
        ]
        assert states(daemon) == {"a": "active", "b": "archiving", "c": "active"}
        release(point, holds)
        thread.join(30)
        assert out["result"]["workspace"]["state"] == "archived", out
        assert Path(made["a"]["path"]).is_dir() and Path(made["c"]["path"]).is_dir()
    finally:
        daemon.close()
        shutil.rmtree(base, ignore_errors=True)


def test_an_owed_teardown_is_refused_before_anything_is_removed(
    tmp_short: Path, root: Path, ctl: Path
) -> None:
    """An archived workspace still owes its teardown (it failed; the retry is far off): the
    project cannot go (the teardown needs its trust), and the other workspaces stay too."""
    repo = make_repo(tmp_short / "repo", {"README.md": "hi\n"})
    commit_scripts(repo, setup=["true"], teardown=failing_teardown(ctl))
    slow = "[cleanup]\nbackoff_initial_s = 120\nbackoff_max_s = 240\nbackoff_jitter = 0\n"
    with trusted_daemon(root, repo, slow) as (daemon, project):
        owing = create(daemon, project["id"], "owing")["workspace"]
        other = create(daemon, project["id"], "other")["workspace"]
        archived = daemon.call("workspace.archive", {"workspace_id": owing["id"]})
        assert archived["cleanup"]["status"] == "pending", archived["cleanup"]
        err = rpc_error(daemon, "project.remove", {"project_id": project["id"], "force": True})
        assert err.kind == "cleanup_pending" and err.data["owed"] == [owing["id"]], err
        assert states(daemon) == {"owing": "archived", "other": "active"}
        assert Path(other["path"]).is_dir()
        (ctl / "ok").touch()
        daemon.call("cleanup.retry", {"workspace_id": owing["id"]})
        done = daemon.call("project.remove", {"project_id": project["id"], "force": True})
        assert done["removed"] is True and not Path(other["path"]).exists()
