"""Cleanup end to end: a real daemon, real git, real teardown scripts (trusted .xum/config.toml),
real SIGKILL. The teardown's behaviour is controlled by files the test creates."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xumd.cleanup.retry import START_HOLD

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import git, make_repo
from tests.support.holds import hold_env, release, wait_held
from tests.support.lifecycle_helpers import (
    add_project,
    assert_git_healthy,
    create,
    trusted_daemon,
    worktrees,
)
from tests.support.procs import alive, identify_all
from tests.support.wait import until

FAST = (
    "[cleanup]\nbackoff_initial_s = 0.2\nbackoff_max_s = 0.4\nbackoff_jitter = 0.1\n"
    "poll_interval_s = 0.5\n"
)


@pytest.fixture
def repo(tmp_short: Path, ctl: Path) -> Path:
    return make_repo(tmp_short / "repo", {"README.md": "hi\n", ".xum/config.toml": ""})


def _write_teardown(repo: Path, ctl: Path) -> None:
    import json

    script = (
        f'if [ -f {ctl}/hang ]; then trap "" TERM; (trap "" TERM; sleep 300) & '
        f"echo $! >> {ctl}/pids; echo $$ >> {ctl}/pids; wait; fi; "
        f"if [ -f {ctl}/ok ]; then echo torn down; exit 0; fi; "
        "echo stopping services; echo 'fatal: database still in use' >&2; exit 3"
    )
    (repo / ".xum" / "config.toml").write_text(f"[scripts]\nteardown = [{json.dumps(script)}]\n")
    git(repo, "add", ".xum/config.toml")
    git(repo, "commit", "-q", "-m", "teardown")


@pytest.fixture
def started(root: Path, repo: Path, ctl: Path) -> Iterator[tuple[DaemonProcess, dict[str, Any]]]:
    _write_teardown(repo, ctl)
    with trusted_daemon(root, repo, FAST) as running:
        yield running


def ws_get(daemon: DaemonProcess, wid: str) -> dict[str, Any]:
    result: dict[str, Any] = daemon.call("workspace.get", {"workspace_id": wid})["workspace"]
    return result


def obligations(daemon: DaemonProcess, wid: str) -> dict[str, dict[str, Any]]:
    listed = daemon.call("cleanup.list", {"workspace_id": wid})["obligations"]
    return {o["kind"]: o for o in listed}


def archive_pending(
    daemon: DaemonProcess, project: dict[str, Any], name: str, **extra: Any
) -> dict[str, Any]:
    ws = create(daemon, project["id"], name, **extra)["workspace"]
    (Path(ws["path"]) / "node_modules").mkdir()
    (Path(ws["path"]) / "node_modules" / "dep.js").write_text("x" * 4000)
    result = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    cleanup = result["cleanup"]
    assert cleanup["status"] == "pending", cleanup
    return {**ws, "archive": result}


def test_teardown_fails_then_the_service_completes_it(
    started: tuple[DaemonProcess, dict[str, Any]], repo: Path, ctl: Path
) -> None:
    daemon, project = started
    with daemon.client() as watcher:
        watcher.call("events.subscribe", {"types": ["cleanup."]})
        ws = archive_pending(daemon, project, "one")
        cleanup = ws["archive"]["cleanup"]
        assert cleanup["attempts"] == 1
        assert cleanup["next_attempt_at"] > time.time() - 1
        assert "database still in use" in cleanup["last_error"]
        assert "exited with 3" in cleanup["last_error"]
        path = Path(ws["path"])
        assert path.is_dir(), "deletion waits for the teardown"
        assert ws_get(daemon, ws["id"])["last_cleanup"]["status"] == "pending"
        assert obligations(daemon, ws["id"])["teardown"]["state"] == "pending"
        status = daemon.call("daemon.status")["details"]["cleanup"]
        assert status["pending"] == 3 and status["oldest"]["workspace_id"] == ws["id"]

        (ctl / "ok").touch()  # no call: the service retries on its own
        until(
            lambda: (ws_get(daemon, ws["id"])["last_cleanup"] or {}).get("status") == "completed",
            message="the retry service to complete the cleanup",
        )
        assert not os.path.lexists(path)
        assert str(path) not in worktrees(repo)
        until(
            lambda: obligations(daemon, ws["id"])["reclaim"]["state"] == "completed",
            message="reclaim",
        )
        reclaim = obligations(daemon, ws["id"])["reclaim"]
        assert reclaim["bytes"] >= 4000
        assert list((daemon.root / "trash").iterdir()) == []
        assert_git_healthy(repo)
        assert daemon.call("daemon.status")["details"]["cleanup"]["pending"] == 0
        # Every state change was an event (queued before the answer to a later call).
        watcher.call("daemon.status")
        events = [
            n["params"]["data"]["obligation"]
            for n in watcher.notifications
            if n["params"]["type"] == "cleanup.obligation_changed"
        ]
        seen = {(e["kind"], e["state"]) for e in events}
        assert {("teardown", "pending"), ("teardown", "completed")} <= seen
        assert {("trash", "completed"), ("reclaim", "completed")} <= seen


def test_sigkill_with_pending_obligations_then_restart_completes(
    started: tuple[DaemonProcess, dict[str, Any]], repo: Path, ctl: Path
) -> None:
    daemon, project = started
    one = archive_pending(daemon, project, "one")
    two = archive_pending(daemon, project, "two")
    daemon.kill()
    (ctl / "ok").touch()
    daemon.start()
    for ws in (one, two):
        until(
            lambda ws=ws: all(
                o["state"] == "completed" for o in obligations(daemon, ws["id"]).values()
            ),
            message=f"cleanup of {ws['name']} after the restart",
        )
        assert not os.path.lexists(ws["path"])
    assert_git_healthy(repo)


def test_crash_between_trash_rename_and_commit_is_replayed(
    root: Path, repo: Path, ctl: Path
) -> None:
    _write_teardown(repo, ctl)
    (ctl / "ok").touch()
    write_config(root, FAST)
    daemon = DaemonProcess(root, env={"XUM_FAULT": "cleanup.trash.after_rename"}).start()
    try:
        project = add_project(daemon, repo)
        daemon.call("project.trust", {"project_id": project["id"]})
        ws = create(daemon, project["id"], "one")["workspace"]
        with pytest.raises(Exception):  # noqa: B017 - the daemon dies mid-call
            daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        assert daemon.wait() == -9
        assert not os.path.lexists(ws["path"])  # moved into the trash, not yet committed
        daemon.env = {}
        daemon.start()
        until(
            lambda: all(o["state"] == "completed" for o in obligations(daemon, ws["id"]).values()),
            message="replayed trash + reclaim",
        )
        assert str(ws["path"]) not in worktrees(repo)
        assert list((root / "trash").iterdir()) == []
        assert_git_healthy(repo)
    finally:
        daemon.close()


def test_stale_obligation_never_touches_the_live_replacement(
    started: tuple[DaemonProcess, dict[str, Any]], repo: Path, ctl: Path, tmp_short: Path
) -> None:
    daemon, project = started
    # Directory runtime: with a worktree, git itself refuses to add a checkout where a locked
    # (missing) one is registered, so the replacement could not appear while this is pending.
    ws = archive_pending(daemon, project, "one", runtime="directory")
    path = Path(ws["path"])
    # The old checkout is moved away by hand; the workspace is unarchived at the same path.
    shutil.move(str(path), str(tmp_short / "old-checkout"))
    restored = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})["workspace"]
    assert restored["state"] == "active" and restored["path"] == ws["path"]
    (path / "new-work.txt").write_text("precious")
    (ctl / "ok").touch()
    daemon.call("cleanup.retry", {"workspace_id": ws["id"]})
    obs = obligations(daemon, ws["id"])
    assert obs["teardown"]["state"] == "abandoned"
    # Settled by unarchive's own forced run (the checkout was gone), or fenced later.
    reason = obs["teardown"]["reason"]
    assert "another incarnation" in reason or "checkout directory is gone" in reason
    assert (path / "new-work.txt").read_text() == "precious"
    assert ws_get(daemon, ws["id"])["state"] == "active"


def test_foreign_directory_in_the_path_is_left_alone(
    started: tuple[DaemonProcess, dict[str, Any]], ctl: Path, tmp_short: Path
) -> None:
    daemon, project = started
    ws = archive_pending(daemon, project, "one")
    path = Path(ws["path"])
    shutil.move(str(path), str(tmp_short / "old-checkout"))
    foreign = tmp_short / "foreign"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("years of work")
    os.rename(foreign, path)
    (ctl / "ok").touch()
    until(
        lambda: all(
            obligations(daemon, ws["id"])[k]["state"] == "abandoned" for k in ("teardown", "trash")
        ),
        message="the stale obligations to be abandoned by the service",
    )
    obs = obligations(daemon, ws["id"])
    assert "replaced by a foreign one" in obs["teardown"]["reason"]
    assert (path / "thesis.tex").read_text() == "years of work"
    listed = daemon.call("cleanup.list", {"state": "abandoned"})["obligations"]
    assert {o["id"] for o in listed} >= {obs["teardown"]["id"], obs["trash"]["id"]}
    assert ws_get(daemon, ws["id"])["last_cleanup"]["status"] == "failed"


def test_shutdown_with_a_hanging_teardown_is_bounded_and_kills_the_tree(
    started: tuple[DaemonProcess, dict[str, Any]], ctl: Path
) -> None:
    daemon, project = started
    ws = archive_pending(daemon, project, "one")
    (ctl / "hang").touch()  # the next (background) attempt hangs and ignores SIGTERM
    until(
        lambda: (ctl / "pids").exists() and len((ctl / "pids").read_text().split()) == 2,
        message="the hanging teardown to start",
    )
    procs = identify_all(int(p) for p in (ctl / "pids").read_text().split())  # both hang
    started_at = time.monotonic()
    assert daemon.terminate(timeout=30) == 0
    took = time.monotonic() - started_at
    assert took < 15, took
    for proc in procs:
        assert not alive(proc), proc
    (ctl / "hang").unlink()
    (ctl / "ok").touch()
    daemon.start()
    until(
        lambda: all(o["state"] == "completed" for o in obligations(daemon, ws["id"]).values()),
        message="the obligation to complete after the restart",
    )


def test_retry_scopes_and_errors(started: tuple[DaemonProcess, dict[str, Any]], ctl: Path) -> None:
    from tests.support.lifecycle_helpers import rpc_error

    daemon, project = started
    ws = archive_pending(daemon, project, "one")
    teardown = obligations(daemon, ws["id"])["teardown"]
    again = daemon.call("cleanup.retry", {"obligation_id": teardown["id"]})
    assert again["attempted"][0]["id"] == teardown["id"]
    assert again["workspaces"][ws["id"]]["status"] == "pending"
    assert again["workspaces"][ws["id"]]["attempts"] >= 2
    (ctl / "ok").touch()
    done = daemon.call("cleanup.retry", {"workspace_id": ws["id"]})
    assert done["workspaces"][ws["id"]]["status"] == "completed"
    assert not os.path.lexists(ws["path"])
    assert rpc_error(daemon, "cleanup.retry", {"obligation_id": "ob_0000000000000000"}).kind == (
        "not_found"
    )
    assert rpc_error(daemon, "cleanup.retry", {"obligation_id": ws["id"]}).kind == "invalid_scope"
    assert rpc_error(daemon, "cleanup.retry", {"workspace_id": "ws_0000000000000000"}).kind == (
        "not_found"
    )
    assert (
        rpc_error(
            daemon, "cleanup.retry", {"workspace_id": ws["id"], "obligation_id": teardown["id"]}
        ).kind
        == "invalid_params"
    )


def test_cli_cleanup_ls_retry_and_status_line(
    started: tuple[DaemonProcess, dict[str, Any]], ctl: Path
) -> None:
    from click.testing import CliRunner
    from xum_client.cli import cli
    from xum_client.commands.cleanup import status_line

    daemon, project = started
    ws = archive_pending(daemon, project, "one")
    runner = CliRunner()
    listed = runner.invoke(cli, ["--root", str(daemon.root), "cleanup", "ls"])
    assert listed.exit_code == 0, listed.output
    assert "teardown" in listed.output and "pending" in listed.output
    line = status_line(daemon.call("daemon.status")["details"]["cleanup"])
    assert line.startswith("3 pending obligation(s); oldest teardown of " + ws["id"])
    (ctl / "ok").touch()
    retried = runner.invoke(cli, ["--root", str(daemon.root), "cleanup", "retry", ws["id"]])
    assert retried.exit_code == 0, retried.output
    assert f"{ws['id']}: cleanup completed" in retried.output
    assert "reclaim completed" in retried.output
    assert status_line(daemon.call("daemon.status")["details"]["cleanup"]).startswith("0 pending")


def test_readiness_does_not_wait_for_ten_thousand_obligations(root: Path) -> None:
    """The retry service starts after READY=1: a backlog never delays readiness. Shown by
    order, not time: the service is held before its first look at the store, and the daemon
    is ready and answers meanwhile, with every obligation still untouched."""
    import sqlite3

    daemon = DaemonProcess(root).start()
    daemon.terminate()
    db = sqlite3.connect(root / "state.db")
    now = time.time()
    db.executemany(
        "INSERT INTO cleanup_obligations (id, workspace_id, project_id, kind, seq, path, "
        "incarnation, state, next_attempt_at, detail, created_at, updated_at) "
        "VALUES (?, ?, 'prj_0000000000000000', 'teardown', 0, ?, 'i', 'pending', ?, '{}', ?, ?)",
        [
            (f"ob_{i:016x}", f"ws_{i:016x}", f"/nonexistent/{i}", now + 200, now, now)
            for i in range(10_000)
        ],
    )
    db.commit()
    db.close()
    holds = root.parent / "holds"
    daemon.env = hold_env(START_HOLD.name, holds)
    daemon.start()  # waits for READY=1: it would never come if readiness waited for the service
    try:
        wait_held(START_HOLD.name, holds)
        status = daemon.call("daemon.status")["details"]["cleanup"]
        assert status["pending"] == 10_000
        assert (holds / f"{START_HOLD.name}.held").exists(), "the service is still held"
        with sqlite3.connect(root / "state.db") as db:
            touched = db.execute(
                "SELECT count(*) FROM cleanup_obligations WHERE attempts > 0 OR state != 'pending'"
            ).fetchone()[0]
        assert touched == 0
        release(START_HOLD.name, holds)
        until(
            lambda: not (holds / f"{START_HOLD.name}.held").exists(),
            message="the retry service to start",
        )
        assert daemon.call("daemon.status")["details"]["cleanup"]["pending"] == 10_000
    finally:
        daemon.close()


def _teardown_config(repo: Path, ctl: Path, *, setup: bool) -> None:
    import json

    scripts = {"teardown": [f"touch {ctl}/torn-down"]}
    if setup:
        scripts["setup"] = [f"touch {ctl}/set-up"]
    lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in scripts.items())
    (repo / ".xum" / "config.toml").write_text(f"[scripts]\n{lines}")
    git(repo, "add", ".xum/config.toml")
    git(repo, "commit", "-q", "-m", "scripts")


def test_never_trusted_teardown_does_not_block_the_deletion(
    root: Path, repo: Path, ctl: Path
) -> None:
    """Setup never ran (config never trusted): nothing to tear down, so the checkout goes."""
    _teardown_config(repo, ctl, setup=True)
    write_config(root, FAST)
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "never-trusted")["workspace"]
        assert ws["setup"]["status"] == "untrusted"
        result = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        assert result["cleanup"]["status"] == "completed", result["cleanup"]
        assert not os.path.lexists(ws["path"])
        teardown = obligations(daemon, ws["id"])["teardown"]
        assert teardown["state"] == "completed"
        assert teardown["detail"]["teardown"] == "skipped"
        assert not (ctl / "torn-down").exists()
    finally:
        daemon.close()


def test_teardown_owed_by_a_trusted_setup_blocks_until_trusted_again(
    root: Path, repo: Path, ctl: Path
) -> None:
    """Setup ran under a trusted config that changed since: its teardown is owed (fail closed)."""
    _teardown_config(repo, ctl, setup=True)
    write_config(root, FAST)
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        daemon.call("project.trust", {"project_id": project["id"]})
        ws = create(daemon, project["id"], "owed")["workspace"]
        assert ws["setup"]["status"] == "ok" and (ctl / "set-up").exists()
        config = Path(ws["path"]) / ".xum" / "config.toml"
        config.write_text(config.read_text() + "# changed\n")
        result = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        assert result["cleanup"]["status"] == "pending", result["cleanup"]
        assert "trust" in result["cleanup"]["last_error"]
        assert Path(ws["path"]).is_dir(), "the checkout stays until its teardown can run"
        assert not (ctl / "torn-down").exists()
    finally:
        daemon.close()
