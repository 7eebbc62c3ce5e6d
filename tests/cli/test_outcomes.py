"""A result that says part of the work was not done exits 1 on every command, the result still
printed whole (with `--json`: the result object, never the `{"error"}` form, since the daemon
did act); a refusal is the error form (README, "Errors")."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xum_client.commands._outcomes import cleanup_failed, setup_failed

from tests.support.daemon import XUM, DaemonProcess, run_xum, write_config
from tests.support.gitrepo import commit_config, git, make_repo
from tests.support.holds import hold_env, release, wait_held

xum = run_xum


def test_a_create_whose_setup_failed_exits_1_with_its_result(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    repo = make_repo(tmp_short / "repo")
    commit_config(repo, '[scripts]\nsetup = ["echo broken >&2; exit 3"]\n')
    assert xum(daemon, "project", "add", str(repo), "--name", "proj").returncode == 0
    untrusted = xum(daemon, "ws", "new", "proj", "skipped")
    assert untrusted.returncode == 0, untrusted  # skipped, not failed: `xum ws setup` runs it
    assert xum(daemon, "project", "trust", "proj").returncode == 0

    made = xum(daemon, "--json", "ws", "new", "proj", "a")
    assert made.returncode == 1, made
    result: dict[str, Any] = json.loads(made.stdout)
    assert "error" not in result
    assert result["setup"]["status"] == "failed"
    assert result["workspace"]["state"] == "active"  # the workspace is there: said, not hidden
    text = xum(daemon, "ws", "new", "proj", "b")
    assert text.returncode == 1
    assert text.stdout.startswith("created b ") and "setup: failed" in text.stdout
    # The odd one out before: `ws setup` already exited 1 on the same outcome.
    again = xum(daemon, "--json", "ws", "setup", "proj/b")
    assert again.returncode == 1 and json.loads(again.stdout)["setup"]["status"] == "failed"
    # Every other command that runs a setup says the same.
    turn = xum(daemon, "--json", "turn", "new", "proj/a")
    assert turn.returncode == 1, turn
    assert json.loads(turn.stdout)["setup"]["status"] == "failed"
    turn_text = xum(daemon, "turn", "new", "proj/a")
    assert turn_text.returncode == 1 and "setup: failed" in turn_text.stdout, turn_text
    archived = xum(daemon, "ws", "archive", "proj/b")
    assert archived.returncode == 0, archived  # nothing left undone: no teardown, path free
    restored = xum(daemon, "--json", "ws", "unarchive", "proj/b")
    assert restored.returncode == 1, restored
    assert json.loads(restored.stdout)["setup"]["status"] == "failed"


POINT = "cleanup.trash.hold_before_rename"


def _swapped_at_the_trash_step(
    daemon: DaemonProcess, holds: Path, path: Path, aside: Path, *args: str
) -> tuple[int, dict[str, Any]]:
    """`xum --json ARGS`, whose trash step finds someone else's directory at the checkout's
    path after its fence: the move sees it, puts it back and abandons the step."""
    command = subprocess.Popen(
        [XUM, "--root", str(daemon.root), "--json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_held(POINT, holds)
        os.rename(path, aside)
        path.mkdir()
        (path / "thesis.tex").write_text("years of work")
        release(POINT, holds)
        out, err = command.communicate(timeout=120)
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
    assert (path / "thesis.tex").read_text() == "years of work"
    result: dict[str, Any] = json.loads(out) if out else {"stderr": err}
    return command.returncode, result


def test_an_archive_or_remove_whose_cleanup_failed_exits_1_with_its_result(
    tmp_short: Path,
) -> None:
    holds = tmp_short / "holds"
    daemon = DaemonProcess(tmp_short / "root", env=hold_env(POINT, holds)).start()
    try:
        repo = make_repo(tmp_short / "repo")
        assert xum(daemon, "project", "add", str(repo), "--name", "proj").returncode == 0
        paths = {
            name: Path(
                json.loads(xum(daemon, "--json", "ws", "new", "proj", name).stdout)["workspace"][
                    "path"
                ]
            )
            for name in ("a", "b")
        }
        code, result = _swapped_at_the_trash_step(
            daemon, holds, paths["a"], tmp_short / "a-aside", "ws", "archive", "proj/a"
        )
        assert code == 1, result
        assert "error" not in result
        assert result["cleanup"]["status"] == "failed", result["cleanup"]
        # The workspace is archived (the logical result) all the same.
        shown = json.loads(xum(daemon, "--json", "ws", "show", "proj/a").stdout)
        assert shown["workspace"]["state"] == "archived"

        code, result = _swapped_at_the_trash_step(
            daemon, holds, paths["b"], tmp_short / "b-aside", "ws", "rm", "proj/b"
        )
        assert code == 1, result
        assert "error" not in result and result["removed"] is True, result
        assert result["cleanup"]["status"] == "failed", result["cleanup"]
    finally:
        daemon.close()


@pytest.mark.parametrize(
    ("cleanup", "failed"),
    [
        (None, False),
        ({"status": "completed"}, False),
        ({"status": "pending", "next_attempt_at": 1.0}, False),  # the daemon retries it
        ({"status": "not_needed"}, False),
        ({"status": "failed", "reason": "trash: foreign"}, True),
        ({"status": "completed", "reclaim": {"status": "pending"}}, False),
        ({"status": "completed", "reclaim": {"status": "failed"}}, True),
    ],
)
def test_which_cleanups_count_as_not_done(cleanup: dict[str, Any] | None, failed: bool) -> None:
    assert cleanup_failed(cleanup) is failed


@pytest.mark.parametrize(
    ("setup", "failed"),
    [
        (None, False),
        ({"status": "ok"}, False),
        ({"status": "untrusted"}, False),
        ({"status": "none"}, False),
        ({"status": "failed"}, True),
        ({"status": "timeout"}, True),
    ],
)
def test_which_setups_count_as_not_done(setup: dict[str, Any] | None, failed: bool) -> None:
    assert setup_failed({"setup": setup}) is failed


@contextlib.contextmanager
def _trusted_project(tmp_short: Path, daemon_config: str, scripts: str) -> Iterator[DaemonProcess]:
    """A daemon of its own (configured by `daemon_config`) with one trusted project `proj`
    whose committed config is `scripts`."""
    root = tmp_short / "root"
    write_config(root, daemon_config)
    daemon = DaemonProcess(root).start()
    try:
        repo = make_repo(tmp_short / "repo")
        commit_config(repo, scripts)
        assert xum(daemon, "project", "add", str(repo), "--name", "proj").returncode == 0
        assert xum(daemon, "project", "trust", "proj").returncode == 0
        yield daemon
    finally:
        daemon.close()


def test_a_setup_that_timed_out_is_not_done_either(tmp_short: Path) -> None:
    # `timeout` is a setup that ran and did not succeed: `ws setup` exited 0 on it before.
    scripts = '[scripts]\nsetup = ["sleep 60"]\n'
    with _trusted_project(tmp_short, "script_timeout_s = 0.5\n", scripts) as daemon:
        made = xum(daemon, "--json", "ws", "new", "proj", "a")
        assert made.returncode == 1, made
        assert json.loads(made.stdout)["setup"]["status"] == "timeout"
        again = xum(daemon, "--json", "ws", "setup", "proj/a")
        assert again.returncode == 1, again
        assert json.loads(again.stdout)["setup"]["status"] == "timeout"


@pytest.mark.reliability  # ~8 s: a daemon of its own, a teardown's failure and a retry
def test_a_cleanup_retry_that_ends_failed_exits_1_and_a_pending_one_0(tmp_short: Path) -> None:
    # A teardown that fails, retried by the daemon only in two minutes: pending meanwhile.
    backoff = "[cleanup]\nbackoff_initial_s = 120\nbackoff_max_s = 240\n"
    with _trusted_project(tmp_short, backoff, '[scripts]\nteardown = ["exit 3"]\n') as daemon:
        made = json.loads(xum(daemon, "--json", "ws", "new", "proj", "a").stdout)
        archived = xum(daemon, "--json", "ws", "archive", "proj/a")
        assert archived.returncode == 0, archived  # pending: the daemon retries it
        assert json.loads(archived.stdout)["cleanup"]["status"] == "pending"
        retried = xum(daemon, "cleanup", "retry", "proj/a")
        assert retried.returncode == 0, retried  # still pending: not a failure
        # Someone else's directory now sits at the checkout's path: the retry's fence leaves
        # it alone and abandons the steps; the cleanup has failed.
        path = Path(made["workspace"]["path"])
        os.rename(path, tmp_short / "original")
        path.mkdir()
        (path / "thesis.tex").write_text("years of work")
        failed = xum(daemon, "--json", "cleanup", "retry", "proj/a")
        assert failed.returncode == 1, failed
        statuses = json.loads(failed.stdout)["workspaces"]
        assert [s["status"] for s in statuses.values()] == ["failed"], statuses
        assert (path / "thesis.tex").read_text() == "years of work"


def test_an_unarchive_whose_preserved_file_is_not_in_place_exits_1(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    # The branch's setup (trusted) makes a directory where the user's preserved `.env.local`
    # goes: the file cannot be put back without deleting setup's directory (never done), so
    # the copy is kept and the unarchive is not all done.
    repo = make_repo(
        tmp_short / "repo",
        {
            ".gitignore": ".env.local\n",
            ".xum/config.toml": '[scripts]\npreserve = [".env*"]\n',
        },
    )
    assert xum(daemon, "project", "add", str(repo), "--name", "proj").returncode == 0
    made = json.loads(xum(daemon, "--json", "ws", "new", "proj", "a").stdout)
    (Path(made["workspace"]["path"]) / ".env.local").write_text("LOCAL=1\n")
    assert xum(daemon, "ws", "archive", "proj/a").returncode == 0
    config = '[scripts]\nsetup = ["rm -f .env.local; mkdir .env.local"]\npreserve = [".env*"]\n'
    git(repo, "checkout", "-q", "xum/a")
    commit_config(repo, config, "setup makes a directory")
    git(repo, "checkout", "-q", "main")
    digest = hashlib.sha256(config.encode()).hexdigest()
    assert xum(daemon, "project", "trust", "proj", "--hash", digest).returncode == 0

    restored = xum(daemon, "--json", "ws", "unarchive", "proj/a")
    assert restored.returncode == 1, restored
    result = json.loads(restored.stdout)
    assert result["setup"]["status"] == "ok"  # only the preserved file is not done
    assert result["restored"]["unverified"] == [".env.local"]
    kept = Path(result["restored"]["kept_at"])
    assert (kept / "files" / ".env.local").read_text() == "LOCAL=1\n"
