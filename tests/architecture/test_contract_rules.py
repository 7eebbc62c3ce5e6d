"""Contract rules that another test guarded only in passing: each one stated here on its own, with
real parts (a real daemon, real git repositories, real sockets, a real SIGKILL), so that breaking
the rule fails a test whose name says which rule broke.

- a git of the user's working in a linked worktree (a workspace's checkout) keeps its lock: the
  daemon's stale-lock sweep, run by another create, leaves it;
- the cleanup's trash step compares preserved files with their saved copy, not only unarchive;
- `remove --force` snapshots the work before the checkout goes;
- at start-up a restore rolls forward only once its checkout's identity was recorded;
- a live listener on the socket path is never unlinked: the daemon refuses to start;
- gc leaves the rows the start-up pass flagged.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from xum_client.errors import XumClientError

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import GIT_ENV, git, make_repo
from tests.support.holds import hold_env
from tests.support.lifecycle_helpers import add_project, create, failing_teardown, trusted_daemon
from tests.support.wait import until

DAY_S = 86400.0


def _workspace(daemon: DaemonProcess, wid: str) -> dict[str, Any]:
    found: dict[str, Any] = daemon.call("workspace.get", {"workspace_id": wid})["workspace"]
    return found


def _obligations(daemon: DaemonProcess, wid: str) -> dict[str, dict[str, Any]]:
    listed = daemon.call("cleanup.list", {"workspace_id": wid})["obligations"]
    return {o["kind"]: o for o in listed}


def _last_pass(daemon: DaemonProcess) -> dict[str, int]:
    actions: dict[str, int] = daemon.call("daemon.status")["details"]["recovery"]["last_pass"][
        "actions"
    ]
    return actions


# -- git locks ---------------------------------------------------------------------------------


def test_a_git_working_in_a_linked_worktree_keeps_its_lock_when_another_workspace_is_made(
    daemon: DaemonProcess, tmp_short: Path, started_procs: list[subprocess.Popen[Any]]
) -> None:
    repo = make_repo(tmp_short / "repo")
    project = add_project(daemon, repo)
    checkout = Path(create(daemon, project["id"], "first")["workspace"]["path"])

    # The user's `git commit` in that checkout (a linked worktree), waiting in its editor: git
    # wrote the worktree's own index.lock and closed it, so no descriptor ties the lock to it;
    # only its working directory (a `.git` file naming the admin dir) leads to the repository.
    ctl = tmp_short / "ctl"
    ctl.mkdir()
    os.mkfifo(ctl / "go")
    (checkout / "README.md").write_text("changed by the user\n")
    editor = (
        f'f() {{ : > "{ctl}/editing"; read line < "{ctl}/go"; echo "user message" > "$1"; }}; f'
    )
    commit = subprocess.Popen(
        ["git", "commit", "-a"],
        cwd=checkout,
        env={**os.environ, **GIT_ENV, "GIT_EDITOR": editor},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started_procs.append(commit)
    until((ctl / "editing").exists, message="git commit in the editor")
    where = git(checkout, "rev-parse", "--path-format=absolute", "--git-path", "index.lock")
    lock = Path(where.strip())
    assert lock.parent.parent.name == "worktrees" and lock.exists()
    # Old enough to be cleared if nobody were working: the user went for coffee.
    past = time.time() - 3600
    os.utime(lock, (past, past))

    # Another create sweeps the repository's stale locks (under its admin lock) first.
    made = create(daemon, project["id"], "second")
    assert made["workspace"]["state"] == "active"
    assert made["cleared_locks"] == []
    assert lock.exists()

    with open(ctl / "go", "w") as go:
        go.write("done\n")
    out, _ = commit.communicate(timeout=20)
    assert commit.returncode == 0, out
    assert git(checkout, "log", "-1", "--format=%s").strip() == "user message"
    assert git(checkout, "show", "HEAD:README.md") == "changed by the user\n"


# -- the cleanup's trash step ------------------------------------------------------------------


def test_cleanup_retry_never_trashes_an_archived_checkout_whose_preserved_file_changed(
    tmp_short: Path, ctl: Path
) -> None:
    # Only the preserved (ignored) file changes after the archive: git sees nothing, so only
    # the comparison with the saved copy can hold the trash step.
    config = '[scripts]\npreserve = [".env"]\n' + (
        f"teardown = [{json.dumps(failing_teardown(ctl))}]\n"
    )
    repo = make_repo(
        tmp_short / "repo",
        {"README.md": "hi\n", ".gitignore": ".env\n", ".xum/config.toml": config},
    )
    # No background retry within the test: the retry asserted is the test's own.
    slow = "[cleanup]\nbackoff_initial_s = 120\nbackoff_max_s = 240\nbackoff_jitter = 0\n"
    with trusted_daemon(tmp_short / "root", repo, slow) as (daemon, project):
        ws = create(daemon, project["id"], "a")["workspace"]
        path = Path(ws["path"])
        (path / ".env").write_text("API_KEY=saved-by-the-archive\n")
        archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        # The teardown failed: the checkout lingers, its cleanup pending.
        assert archived["cleanup"]["status"] == "pending", archived["cleanup"]
        (path / ".env").write_text("API_KEY=edited-after-the-archive\n")
        (ctl / "ok").touch()  # the teardown passes now: only the edit can hold the trash step

        daemon.call("cleanup.retry", {"workspace_id": ws["id"]})

        obs = _obligations(daemon, ws["id"])
        assert obs["teardown"]["state"] == "completed", obs["teardown"]
        assert obs["trash"]["state"] == "pending", obs["trash"]
        assert ".env" in (obs["trash"]["last_error"] or ""), obs["trash"]
        assert (path / ".env").read_text() == "API_KEY=edited-after-the-archive\n"


# -- remove --------------------------------------------------------------------------------------


def test_remove_with_force_snapshots_the_work_before_the_checkout_goes(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    repo = make_repo(tmp_short / "repo", {"README.md": "hi\n"})
    project = add_project(daemon, repo)
    ws = create(daemon, project["id"], "a")["workspace"]
    path = Path(ws["path"])
    (path / "README.md").write_text("edited, never committed\n")
    (path / "notes.txt").write_text("untracked work\n")

    removed = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})

    assert removed["removed"] is True
    until(lambda: not path.exists(), message="the checkout to go")
    snap = removed["snapshot"]
    assert snap is not None, removed
    # The work is in the repository, under a ref that outlives the checkout.
    assert git(repo, "rev-parse", snap["ref"]).strip() == snap["commit"]
    assert git(repo, "show", f"{snap['commit']}:README.md") == "edited, never committed\n"
    assert git(repo, "show", f"{snap['commit']}:notes.txt") == "untracked work\n"


# -- start-up: a restore cut by a crash --------------------------------------------------------


def test_at_start_up_a_restore_rolls_forward_only_once_its_checkout_was_recorded(
    tmp_short: Path,
) -> None:
    repo = make_repo(tmp_short / "repo", {"README.md": "hi\n"})
    root = tmp_short / "root"
    # Killed after the restore wrote the files but before the checkout's identity was recorded.
    daemon = DaemonProcess(root, env={"XUM_FAULT": "workspace.unarchive.after_restore"}).start()
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "a")["workspace"]
        path = Path(ws["path"])
        (path / "work.txt").write_text("saved by the archive\n")
        daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        with pytest.raises((XumClientError, OSError)):
            daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
        assert daemon.wait() == -signal.SIGKILL
    finally:
        daemon.close()

    # Not recorded: the restore may be partial, so it rolls back (archived, not flagged).
    # This start is armed to die after setup, when the identity is recorded.
    daemon = DaemonProcess(root, env={"XUM_FAULT": "workspace.unarchive.after_setup"}).start()
    try:
        row = _workspace(daemon, ws["id"])
        assert (row["state"], row["interrupted"]) == ("archived", False), row
        assert _last_pass(daemon) == {"unarchive_rolled_back": 1}

        # Its partial checkout is freed by a fenced cleanup, not by the pass itself; waited for
        # here, because an unarchive begun while that cleanup runs fails on its own account.
        def freed() -> bool:
            listed = daemon.call("cleanup.list", {"workspace_id": ws["id"]})["obligations"]
            return not path.exists() and all(o["state"] == "completed" for o in listed)

        until(freed, message="the rolled-back checkout's cleanup")
        with pytest.raises((XumClientError, OSError)):
            daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
        assert daemon.wait() == -signal.SIGKILL
    finally:
        daemon.close()

    # Recorded: the restore finished, so it rolls forward (active, the work in place).
    daemon = DaemonProcess(root).start()
    try:
        row = _workspace(daemon, ws["id"])
        assert (row["state"], row["interrupted"]) == ("active", False), row
        assert _last_pass(daemon) == {"unarchive_completed": 1}
        assert (path / "work.txt").read_text() == "saved by the archive\n"
    finally:
        daemon.close()


# -- the socket --------------------------------------------------------------------------------


def test_a_live_listener_on_the_socket_path_is_never_unlinked_and_the_daemon_does_not_start(
    tmp_short: Path,
) -> None:
    root = tmp_short / "root"
    root.mkdir(mode=0o700)
    path = root / "xumd.sock"
    # Someone else listens there (the systemd socket unit, say): the path is theirs.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    listener.settimeout(10)
    inode = path.stat().st_ino
    daemon = DaemonProcess(root).start(wait_ready=False)
    try:
        # It exits without ever being ready (a daemon that took the path would be).
        with pytest.raises(TimeoutError):
            daemon.wait_for_notify("READY=1", timeout=30)
        assert daemon.wait() != 0
        assert path.stat().st_ino == inode
        # A client of the path still reaches the listener.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))
            accepted, _ = listener.accept()
            accepted.close()
    finally:
        daemon.close()
        listener.close()


# -- gc ------------------------------------------------------------------------------------------


def test_gc_leaves_the_workspaces_the_start_up_pass_flagged(tmp_short: Path) -> None:
    repo = make_repo(tmp_short / "repo", {"README.md": "hi\n"})
    root = tmp_short / "root"
    held = tmp_short / "held"
    policies = "enable_test_methods = true\n[gc]\narchived_after_days = 7\narchive_merged = true\n"
    write_config(root, policies)
    # Both removals hold after their intent (`removing`) is committed; the daemon is then
    # killed: the start-up pass puts each back where it was, flagged for the user to look at.
    daemon = DaemonProcess(root, env=hold_env("workspace.remove.hold", held)).start()
    try:
        project = add_project(daemon, repo)
        # Merged and clean: what archive_merged collects.
        merged = create(daemon, project["id"], "merged")["workspace"]
        merged_path = Path(merged["path"])
        (merged_path / "m.txt").write_text("merged\n")
        git(merged_path, "add", "m.txt")
        git(merged_path, "commit", "-q", "-m", "merged")
        git(repo, "merge", "-q", "--no-edit", "xum/merged")
        # Archived: what archived_after_days collects.
        old = create(daemon, project["id"], "old")["workspace"]
        daemon.call("workspace.archive", {"workspace_id": old["id"]})

        with ThreadPoolExecutor(2) as pool:
            cut = [
                pool.submit(daemon.call, "workspace.remove", {"workspace_id": w["id"]})
                for w in (merged, old)
            ]
            for w in (merged, old):
                until(
                    lambda w=w: _workspace(daemon, w["id"])["state"] == "removing",
                    message=f"{w['name']}'s removal to hold",
                )
            assert daemon.kill() == -signal.SIGKILL
            for future in cut:
                with pytest.raises((XumClientError, OSError)):
                    future.result(timeout=20)
    finally:
        daemon.close()

    daemon = DaemonProcess(root).start()
    try:
        for w, state in ((merged, "active"), (old, "archived")):
            row = _workspace(daemon, w["id"])
            assert (row["state"], row["interrupted"]) == (state, True), row
        daemon.call("test.clock_advance", {"seconds": 8 * DAY_S})

        plan = daemon.call("gc.plan")
        assert plan["items"] == [], plan
        skipped = {s["key"]: s["reason"] for s in plan["skipped"]}
        for key in (f"archive_merged:{merged['id']}", f"remove_archived:{old['id']}"):
            assert key in skipped and skipped[key].startswith("interrupted"), skipped
        assert daemon.call("gc.run")["done"] == []
        assert _workspace(daemon, merged["id"])["state"] == "active"
        assert _workspace(daemon, old["id"])["state"] == "archived"
        assert merged_path.is_dir()
    finally:
        daemon.close()
