"""The `xum project` / `xum ws` / `xum events` commands against a real daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import commit_config, git, make_repo

XUM = str(Path(sys.executable).parent / "xum")


def xum(daemon: DaemonProcess, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [XUM, "--root", str(daemon.root), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def xum_json(daemon: DaemonProcess, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(xum(daemon, "--json", *args).stdout)
    return result


@pytest.fixture
def repo(tmp_short: Path) -> Path:
    return make_repo(tmp_short / "repo")


def test_cli_full_lifecycle(daemon: DaemonProcess, repo: Path) -> None:
    added = xum_json(daemon, "project", "add", str(repo))
    assert added["project"]["name"] == "repo"
    assert "repo" in xum(daemon, "project", "ls").stdout

    created = xum_json(daemon, "ws", "new", "repo", "one")
    ws_id = created["workspace"]["id"]
    human = xum(daemon, "ws", "new", "repo", "two").stdout
    assert human.startswith("created two (ws_")

    # addressable by project/name and by id, with --json everywhere
    shown = xum_json(daemon, "ws", "show", "repo/one")
    assert shown["workspace"]["id"] == ws_id
    assert xum_json(daemon, "ws", "show", ws_id)["workspace"]["name"] == "one"
    listed = xum_json(daemon, "ws", "ls", "--project", "repo")
    assert [w["name"] for w in listed["workspaces"]] == ["one", "two"]

    path = Path(created["workspace"]["path"])
    (path / "work.txt").write_text("w\n")
    not_safe = xum(daemon, "ws", "rm", "repo/one", ok=False)
    assert not_safe.returncode == 1
    assert "not_safe" in not_safe.stderr and "work.txt" in not_safe.stderr

    archived = xum(daemon, "ws", "archive", "repo/one").stdout
    assert "archived one" in archived
    assert "snapshot: refs/xum/snapshots/" in archived
    assert "cleanup: completed" in archived
    assert not path.exists()
    restored = xum(daemon, "ws", "unarchive", "repo/one").stdout
    assert "restored one" in restored
    assert (path / "work.txt").read_text() == "w\n"

    moved = xum_json(daemon, "ws", "mv", "repo/one", "uno")
    assert moved["workspace"]["branch"] == "xum/uno"
    assert git(repo, "branch", "--list", "xum/uno").strip()

    keep = xum(daemon, "ws", "keep", "repo/uno", ok=False)
    assert "invalid_state" in keep.stderr

    removed = xum_json(daemon, "ws", "rm", "repo/uno", "--force")
    assert removed["removed"] is True and removed["snapshot"] is not None
    missing = xum(daemon, "ws", "show", "repo/uno", ok=False)
    assert missing.returncode == 3

    gone = xum_json(daemon, "project", "rm", "repo")
    assert [w["name"] for w in gone["workspaces"]] == ["two"]
    assert repo.is_dir() and (repo / ".git").is_dir()
    assert xum_json(daemon, "project", "ls")["projects"] == []


def test_cli_trust(daemon: DaemonProcess, repo: Path) -> None:
    commit_config(repo, '[scripts]\nsetup = ["touch ran"]\n')
    xum(daemon, "project", "add", str(repo), "--name", "proj")
    untrusted = xum(daemon, "ws", "new", "proj", "a").stdout
    assert "setup: untrusted" in untrusted
    assert "xum project trust" in untrusted
    trusted = xum(daemon, "project", "trust", "proj").stdout
    assert trusted.startswith("trusted ")
    assert "setup: ok" in xum(daemon, "ws", "new", "proj", "b").stdout


def test_cli_events(daemon: DaemonProcess, repo: Path) -> None:
    proc = subprocess.Popen(
        [XUM, "--root", str(daemon.root), "--json", "events", "--count", "2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())  # the subscribe answer comes first
        assert isinstance(first["seq"], int) and "workspaces" in first["snapshot"]
        daemon.call("project.add", {"path": str(repo)})
        events = [json.loads(proc.stdout.readline()) for _ in range(1)]
        assert events[0]["type"] == "project.added"
        assert events[0]["seq"] > first["seq"]
    finally:
        proc.kill()
        proc.wait(10)


def test_cli_show_reports_auto_archive(daemon: DaemonProcess, repo: Path) -> None:
    from tests.support.wait import until

    xum(daemon, "project", "add", str(repo))
    created = xum_json(daemon, "ws", "new", "repo", "auto", "--auto-archive", "on_agent_exit")
    assert created["workspace"]["auto_archive"] == "on_agent_exit"
    assert "auto-archive: on_agent_exit\n" in xum(daemon, "ws", "show", "repo/auto").stdout + "\n"
    params = {"workspace_id": created["workspace"]["id"], "kind": "agent", "argv": ["true"]}
    daemon.call("process.spawn", params)
    until(
        lambda: (
            "last: archived after 1 attempt(s)" in xum(daemon, "ws", "show", "repo/auto").stdout
        ),
        message="the outcome in `xum ws show`",
    )


def test_cli_status_shows_cleanup_backlog_and_interrupted(root: Path, repo: Path) -> None:
    from tests.support.daemon import write_config

    # A teardown that fails, retried only in two minutes: its obligations stay pending.
    commit_config(repo, '[scripts]\nteardown = ["exit 3"]\n')
    write_config(root, "[cleanup]\nbackoff_initial_s = 120\nbackoff_max_s = 240\n")
    daemon = DaemonProcess(root, env={"XUM_FAULT": "workspace.create.after_checkout"}).start()
    try:
        pid = xum_json(daemon, "project", "add", str(repo))["project"]["id"]
        xum(daemon, "project", "trust", "repo")
        assert xum(daemon, "ws", "new", "repo", "cut", ok=False).returncode != 0
        assert daemon.wait() == -9  # killed at the fault point, mid-create
        daemon.env = {}
        daemon.start()
        one = daemon.call("workspace.create", {"project_id": pid, "name": "one"})["workspace"]
        archived = daemon.call("workspace.archive", {"workspace_id": one["id"]})
        assert archived["cleanup"]["status"] == "pending"

        lines = xum(daemon, "status").stdout.splitlines()

        assert "interrupted: 1" in lines
        (cleanup,) = [line for line in lines if line.startswith("cleanup:")]
        assert cleanup.startswith(
            f"cleanup:     3 pending obligation(s); oldest teardown of {one['id']}"
        )
        assert "1 attempt(s)" in cleanup
        assert xum_json(daemon, "status")["details"]["cleanup"]["pending"] == 3
    finally:
        daemon.close()


def test_cli_archive_names_the_special_files_it_could_not_save(
    daemon: DaemonProcess, repo: Path
) -> None:
    # A FIFO in the checkout cannot be archived; the summary says so instead of "no ignored
    # files" (the daemon reports it in dropped.special).
    xum(daemon, "project", "add", str(repo))
    made = xum_json(daemon, "ws", "new", "repo", "fifo")
    os.mkfifo(Path(made["workspace"]["path"]) / "pipe")
    archived = xum(daemon, "ws", "archive", "repo/fifo").stdout
    assert "1 special file(s) not saved: pipe (fifo)" in archived, archived
    assert "dropped: no ignored files" not in archived
