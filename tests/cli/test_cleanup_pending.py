"""`xum ws rm`, `xum ws archive` and `xum project rm` when the physical cleanup did not happen,
forced with real parts: a checkout the kernel refuses to move (`chattr +i`: EPERM even for root)
and a teardown script that fails. The exit code and the words say what is left (README, "Done,
but not all of it"): `pending` exits 0 and says when the daemon tries again and why it could not;
a project whose owed teardown keeps it exits 1 naming `cleanup_pending`; never a bare success."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xum_client.commands._outcomes import cleanup_line

from tests.support.daemon import DaemonProcess, run_xum, short_tmpdir, write_config
from tests.support.fsattr import immutable
from tests.support.gitrepo import commit_config, make_repo

# Retried by the daemon only minutes later: a pending cleanup stays pending while it is read.
SLOW_RETRY = "[cleanup]\nbackoff_initial_s = 120\nbackoff_max_s = 240\nbackoff_jitter = 0\n"
EPERM = "Operation not permitted"
PENDING = re.compile(r"cleanup: pending, next attempt in \d+m?s?, at \d\d:\d\d:\d\d")


xum = run_xum


@pytest.fixture(scope="module")
def slow_daemon() -> Iterator[DaemonProcess]:
    base = short_tmpdir()
    write_config(base / "root", SLOW_RETRY)
    daemon = DaemonProcess(base / "root").start()
    try:
        yield daemon
    finally:
        daemon.close()
        shutil.rmtree(base, ignore_errors=True)


def _project(daemon: DaemonProcess, name: str, teardown: str | None = None) -> None:
    # Beside the module's daemon root, kept for its life: a repository deleted at one test's
    # end could hand its inode to the next test's, which the daemon would take for the same
    # directory (a project is known by its inode too, so that a moved one is recognised).
    repo = make_repo(daemon.root.parent / name)
    if teardown is not None:
        commit_config(repo, f"[scripts]\nteardown = [{json.dumps(teardown)}]\n")
    added = xum(daemon, "project", "add", str(repo), "--name", name)
    assert added.returncode == 0, added
    if teardown is not None:
        assert xum(daemon, "project", "trust", name).returncode == 0


def _new(daemon: DaemonProcess, ref: str) -> dict[str, Any]:
    project, name = ref.split("/")
    made = xum(daemon, "--json", "ws", "new", project, name)
    assert made.returncode == 0, made
    workspace: dict[str, Any] = json.loads(made.stdout)["workspace"]
    return workspace


def test_a_removal_the_kernel_refuses_says_pending_then_a_retry_completes_it(
    slow_daemon: DaemonProcess,
) -> None:
    _project(slow_daemon, "pa")
    a, b = _new(slow_daemon, "pa/a"), _new(slow_daemon, "pa/b")
    with immutable(Path(a["path"])), immutable(Path(b["path"])):
        text = xum(slow_daemon, "ws", "rm", "pa/a")
        # Pending is not a failure (the daemon retries it: exit 0), but it is never "completed"
        # and it says when, why, and how to try now.
        assert text.returncode == 0, text
        assert text.stdout.startswith(f"removed {a['id']} ")
        assert PENDING.search(text.stdout), text.stdout
        assert EPERM in text.stdout and "xum cleanup retry" in text.stdout
        assert "completed" not in text.stdout

        as_json = xum(slow_daemon, "--json", "ws", "archive", "pa/b")
        assert as_json.returncode == 0, as_json
        result = json.loads(as_json.stdout)
        assert "error" not in result and result["workspace"]["state"] == "archived"
        cleanup = result["cleanup"]
        assert cleanup["status"] == "pending", cleanup
        assert EPERM in cleanup["last_error"] and cleanup["next_attempt_at"] > 0
        assert cleanup["obligations"], cleanup
        assert Path(a["path"]).is_dir() and Path(b["path"]).is_dir()
    # The kernel lets go: a retry now frees both paths, and says so.
    for ws in (a, b):
        retried = xum(slow_daemon, "--json", "cleanup", "retry", ws["id"])
        assert retried.returncode == 0, retried
        statuses = json.loads(retried.stdout)["workspaces"]
        assert statuses[ws["id"]]["status"] == "completed", statuses
        assert not Path(ws["path"]).exists()


def test_project_rm_says_which_workspace_s_cleanup_is_pending_and_why(
    slow_daemon: DaemonProcess,
) -> None:
    for name in ("pb", "pc"):
        _project(slow_daemon, name)
    stuck, free = _new(slow_daemon, "pb/stuck"), _new(slow_daemon, "pb/free")
    stuck_json = _new(slow_daemon, "pc/stuck")
    with immutable(Path(stuck["path"])), immutable(Path(stuck_json["path"])):
        text = xum(slow_daemon, "project", "rm", "pb")
        assert text.returncode == 0, text  # pending: retried by the daemon
        lines = text.stdout.splitlines()
        assert lines[0].startswith("removed project pb ")
        at = lines.index("  workspace stuck: removed")
        # The next line is that workspace's cleanup, in the same words as `xum ws rm`.
        assert PENDING.search(lines[at + 1]) and EPERM in lines[at + 1], lines
        assert "  workspace free: removed" in lines
        assert not Path(free["path"]).exists()

        as_json = xum(slow_daemon, "--json", "project", "rm", "pc")
        assert as_json.returncode == 0, as_json
        result = json.loads(as_json.stdout)
        assert result["removed"] is True
        [outcome] = result["workspaces"]
        cleanup = outcome["result"]["cleanup"]
        assert cleanup["status"] == "pending" and EPERM in cleanup["last_error"], cleanup
        assert Path(stuck_json["path"]).is_dir()
    for ws in (stuck, stuck_json):
        retried = xum(slow_daemon, "--json", "cleanup", "retry", ws["id"])
        assert json.loads(retried.stdout)["workspaces"][ws["id"]]["status"] == "completed"
        assert not Path(ws["path"]).exists()


def test_project_rm_whose_teardown_fails_exits_1_naming_the_owed_teardown(
    slow_daemon: DaemonProcess,
) -> None:
    # The workspaces go, their teardown fails: the project stays (a teardown runs only under
    # its trusted config) and the command fails saying so, in text and in JSON.
    _project(slow_daemon, "pd", teardown="echo still in use >&2; exit 3")
    ws = _new(slow_daemon, "pd/a")
    text = xum(slow_daemon, "project", "rm", "pd")
    assert text.returncode == 1, text
    assert text.stdout == ""
    assert text.stderr.startswith("xum: cleanup_pending: project 'pd' not removed: "), text
    assert ws["id"] in text.stderr and "xum cleanup retry" in text.stderr
    # The project is still there, and a second try says the same as JSON.
    assert xum(slow_daemon, "project", "show", "pd").returncode == 0
    as_json = xum(slow_daemon, "--json", "project", "rm", "pd")
    assert as_json.returncode == 1, as_json
    error = json.loads(as_json.stdout)["error"]
    assert error["kind"] == "cleanup_pending" and error["exit"] == 1, error
    assert error["data"]["owed"] == [ws["id"]], error
    shown = json.loads(xum(slow_daemon, "--json", "cleanup", "ls").stdout)
    teardown = next(o for o in shown["obligations"] if o["workspace_id"] == ws["id"])
    assert teardown["kind"] == "teardown" and teardown["state"] == "pending"
    assert "still in use" in teardown["last_error"]


@pytest.mark.parametrize(
    ("cleanup", "expected"),
    [
        ({"status": "completed"}, ["cleanup: completed"]),
        (
            {"status": "completed", "reclaim": {"status": "failed"}},
            ["cleanup: completed", "reclaim: failed: the trashed checkout was not deleted"],
        ),
        (
            {"status": "failed", "reason": "trash: foreign directory"},
            ["cleanup: failed: trash: foreign directory"],
        ),
        (
            {"status": "pending", "next_attempt_at": 1000.0 + 90, "last_error": "busy"},
            ["cleanup: pending, next attempt in 90s, at ", "(now: xum cleanup retry): busy"],
        ),
        (
            {"status": "pending", "next_attempt_at": 1000.0 + 600},
            ["cleanup: pending, next attempt in 10m, at "],
        ),
        ({"status": "pending", "next_attempt_at": 900.0}, ["next attempt due now (was due at "]),
    ],
)
def test_the_cleanup_line_says_what_made_the_command_exit_1(
    cleanup: dict[str, Any], expected: list[str]
) -> None:
    # A reclaim that failed exits 1 (`cleanup_failed`): the line said only "completed" before.
    line = cleanup_line(cleanup, now=1000.0)
    for part in expected:
        assert part in line, line


def test_project_rm_with_a_mount_inside_one_checkout_removes_nothing_and_says_so(
    slow_daemon: DaemonProcess,
) -> None:
    # A mount inside a checkout (a dataset, a cache): the project's removal refuses `busy`
    # naming it, before anything is removed; text and JSON alike, exit 1.
    from tests.support.tmpfs import tmpfs

    _project(slow_daemon, "pe")
    held, other = _new(slow_daemon, "pe/held"), _new(slow_daemon, "pe/other")
    point = Path(held["path"]) / "mnt"
    with tmpfs(point, "size=1m"):
        (point / "dataset").write_text("not ours\n")
        text = xum(slow_daemon, "project", "rm", "--force", "pe")
        assert text.returncode == 1 and text.stdout == "", text
        assert text.stderr.startswith("xum: busy: project 'pe' not removed, nor any of its "), text
        assert f"mount at {point}" in text.stderr
        as_json = xum(slow_daemon, "--json", "project", "rm", "--force", "pe")
        assert as_json.returncode == 1, as_json
        error = json.loads(as_json.stdout)["error"]
        assert error["kind"] == "busy" and error["exit"] == 1, error
        assert {h["kind"] for h in error["data"]["holders"]} == {"mount"}, error
        assert (point / "dataset").read_text() == "not ours\n"
    # Nothing was removed: both workspaces are there, and the project.
    listed = {w["id"] for w in slow_daemon.call("workspace.list")["workspaces"]}
    assert {held["id"], other["id"]} <= listed
    assert Path(other["path"]).is_dir()
    removed = xum(slow_daemon, "project", "rm", "--force", "pe")
    assert removed.returncode == 0, removed
