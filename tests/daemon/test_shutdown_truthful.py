"""Truthful answers under shutdown (docs/RELIABILITY.md, "truthful answers").

A structural operation cut by a shutdown (`daemon.shutdown`, SIGTERM) once the grace is over
answers what it did: one that committed its logical change (archived, removed, restored) answers
its result, with the physical part `pending` and why; one that committed nothing answers
`shutting_down` and leaves nothing behind. The cut is placed deterministically: a real setup or
teardown script that blocks on a control file (the daemon kills it at the cut), or a held fault
point (tests/support/holds.py). Then a restart finishes what was left pending.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel
from xum_client.errors import XumRpcError
from xum_protocol.models.base import Result
from xumd.base.requestcut import answer_if_cut
from xumd.rpc.dispatch import Router

from tests.support.daemon import DaemonProcess, short_tmpdir, write_config
from tests.support.gitrepo import git, make_repo
from tests.support.holds import hold_env, wait_held
from tests.support.lifecycle_helpers import add_project, branch_exists, create
from tests.support.procs import ProcId, alive, identify
from tests.support.raw import RawPeer
from tests.support.wait import until

CONFIG = (
    "shutdown_grace_s = 0.5\nstop_grace_s = 1.0\n"
    "[cleanup]\nbackoff_initial_s = 0.2\nbackoff_max_s = 0.4\nbackoff_jitter = 0.1\n"
    "poll_interval_s = 0.5\n"
)


@pytest.fixture
def base() -> Iterator[Path]:
    path = short_tmpdir("xumt-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def scripted_repo(base: Path) -> tuple[Path, Path]:
    """A repository whose setup and teardown block while `ctl/block-setup` (or
    `ctl/block-teardown`) exists, and say when they started (and their pid)."""
    ctl = base / "ctl"
    ctl.mkdir()
    setup = (
        f"echo $$ > {ctl}/setup-pid; touch {ctl}/setup-started; "
        f"while [ -e {ctl}/block-setup ]; do sleep 0.05; done"
    )
    teardown = (
        f'if [ -e {ctl}/ignore-term ]; then trap "" TERM; fi; '
        f"echo $$ > {ctl}/teardown-pid; touch {ctl}/teardown-started; "
        f"while [ -e {ctl}/block-teardown ]; do sleep 0.05; done; touch {ctl}/torn-down"
    )
    config = f"[scripts]\nsetup = [{json.dumps(setup)}]\nteardown = [{json.dumps(teardown)}]\n"
    repo = make_repo(base / "repo", {"README.md": "hi\n", ".xum/config.toml": config})
    return repo, ctl


def start(
    base: Path, env: dict[str, str] | None = None
) -> tuple[DaemonProcess, dict[str, Any], Path, Path]:
    repo, ctl = scripted_repo(base)
    root = base / "root"
    write_config(root, CONFIG)
    daemon = DaemonProcess(root, env=env).start()
    project = add_project(daemon, repo)
    daemon.call("project.trust", {"project_id": project["id"]})
    return daemon, project, repo, ctl


def in_thread(call: Callable[[], dict[str, Any]]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = call()
        except XumRpcError as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def cut(daemon: DaemonProcess, thread: threading.Thread, out: dict[str, Any]) -> None:
    """Shut the daemon down while the call runs; the call answers, the daemon exits 0."""
    assert daemon.call("daemon.shutdown") == {"stopping": True}
    thread.join(30)
    assert not thread.is_alive(), "the cut call never answered"
    assert daemon.wait(30) == 0


def script_started(ctl: Path, script: str) -> ProcId:
    """Wait for the `script` (setup or teardown) to start; its process, identified while it
    runs (it writes its pid before it says it started, then blocks)."""
    until((ctl / f"{script}-started").exists, timeout=30, message=f"the {script} to start")
    return identify(int((ctl / f"{script}-pid").read_text()))


def shutting_down(out: dict[str, Any]) -> None:
    assert "result" not in out, f"answered a result: {out.get('result')}"
    assert out["error"].data.get("kind") == "shutting_down", out["error"]


def snapshot_refs(repo: Path) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname)", "refs/xum/snapshots/").split()


# -- committed, then cut: the real result ---------------------------------------------------------


def test_archive_cut_in_its_teardown_answers_archived(base: Path) -> None:
    daemon, project, repo, ctl = start(base)
    try:
        ws = create(daemon, project["id"], "a")["workspace"]
        (Path(ws["path"]) / "notes.txt").write_text("unsaved\n")
        (ctl / "block-teardown").touch()
        thread, out = in_thread(
            lambda: daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        )
        teardown = script_started(ctl, "teardown")
        cut(daemon, thread, out)
        assert "error" not in out, f"a committed archive answered {out.get('error')}"
        result = out["result"]
        assert result["workspace"]["state"] == "archived"
        assert result["snapshot"] is not None and result["snapshot"]["ref"] in snapshot_refs(repo)
        cleanup = result["cleanup"]
        assert cleanup["status"] == "pending", cleanup
        assert "shutting down" in cleanup["reason"], cleanup
        assert "teardown was cut short" in cleanup["last_error"], cleanup
        assert cleanup["next_attempt_at"] is not None and cleanup["obligations"]
        # The teardown was stopped with the daemon; the checkout waits for the retry.
        until(lambda: not alive(teardown), message="the teardown to be stopped")
        assert not (ctl / "torn-down").exists() and Path(ws["path"]).is_dir()
        # The next daemon completes it without any call.
        (ctl / "block-teardown").unlink()
        daemon.start()
        got = until(lambda: _cleanup_done(daemon, ws["id"]), timeout=30, message="the retry")
        assert not os.path.lexists(ws["path"])
        assert (ctl / "torn-down").exists()
        assert got["state"] == "archived" and not got["interrupted"]
        assert got["last_cleanup"]["status"] == "completed", got["last_cleanup"]
        # And the work comes back.
        daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
        assert (Path(ws["path"]) / "notes.txt").read_text() == "unsaved\n"
    finally:
        daemon.close()


def test_a_teardown_that_ignores_sigterm_is_killed_and_the_archive_still_answered(
    base: Path,
) -> None:
    daemon, project, _, ctl = start(base)
    try:
        ws = create(daemon, project["id"], "a")["workspace"]
        (ctl / "block-teardown").touch()
        (ctl / "ignore-term").touch()
        thread, out = in_thread(
            lambda: daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        )
        teardown = script_started(ctl, "teardown")
        cut(daemon, thread, out)  # within the shutdown budget: exit 0, not the forced 70
        assert out["result"]["workspace"]["state"] == "archived", out
        assert out["result"]["cleanup"]["status"] == "pending"
        until(lambda: not alive(teardown), message="the teardown to be SIGKILLed")
    finally:
        daemon.close()


def test_an_auto_archive_cut_in_its_teardown_records_archived(base: Path) -> None:
    import sqlite3

    daemon, project, _, ctl = start(base)
    try:
        ws = create(daemon, project["id"], "a", auto_archive="on_agent_exit")["workspace"]
        (ctl / "block-teardown").touch()
        daemon.call("process.spawn", {"workspace_id": ws["id"], "kind": "agent", "argv": ["true"]})
        until((ctl / "teardown-started").exists, timeout=30, message="the teardown to start")
        assert daemon.call("daemon.shutdown") == {"stopping": True}
        assert daemon.wait(30) == 0
        db = sqlite3.connect(base / "root" / "state.db")
        try:
            state, found = db.execute(
                "SELECT state, auto_archive_outcome FROM workspaces WHERE id = ?", (ws["id"],)
            ).fetchone()
        finally:
            db.close()
        assert state == "archived"
        assert found is not None and json.loads(found)["status"] == "archived", found
    finally:
        daemon.close()


def test_remove_cut_in_its_teardown_answers_removed(base: Path) -> None:
    daemon, project, repo, ctl = start(base)
    try:
        ws = create(daemon, project["id"], "a")["workspace"]
        (Path(ws["path"]) / "notes.txt").write_text("unsaved\n")
        (ctl / "block-teardown").touch()
        thread, out = in_thread(
            lambda: daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
        )
        until((ctl / "teardown-started").exists, timeout=30, message="the teardown to start")
        cut(daemon, thread, out)
        assert "error" not in out, f"a committed remove answered {out.get('error')}"
        result = out["result"]
        assert result["removed"] is True and result["workspace_id"] == ws["id"]
        assert result["snapshot"] is not None  # the forced removal saved the work first
        cleanup = result["cleanup"]
        assert cleanup["status"] == "pending" and "shutting down" in cleanup["reason"], cleanup
        assert "teardown was cut short" in cleanup["last_error"], cleanup
        (ctl / "block-teardown").unlink()
        daemon.start()
        until(lambda: not os.path.lexists(ws["path"]), timeout=30, message="the retry")
        assert (ctl / "torn-down").exists()
        assert daemon.call("workspace.list", {})["workspaces"] == []
        assert branch_exists(repo, "xum/a")  # branches are never deleted
    finally:
        daemon.close()


def test_project_remove_cut_part_way_answers_which_workspaces_went(base: Path) -> None:
    daemon, project, _, ctl = start(base)
    try:
        first = create(daemon, project["id"], "a")["workspace"]
        second = create(daemon, project["id"], "b")["workspace"]
        (ctl / "block-teardown").touch()
        thread, out = in_thread(
            lambda: daemon.call("project.remove", {"project_id": project["id"], "force": True})
        )
        until((ctl / "teardown-started").exists, timeout=30, message="the first teardown")
        cut(daemon, thread, out)
        assert "error" not in out, f"a part-way project.remove answered {out.get('error')}"
        result = out["result"]
        assert result["removed"] is False
        outcomes = {w["name"]: w for w in result["workspaces"]}
        assert outcomes["a"]["ok"] is True and outcomes["b"]["ok"] is False, outcomes
        assert outcomes["b"]["error"]["kind"] == "shutting_down"
        (ctl / "block-teardown").unlink()
        daemon.start()
        left = daemon.call("workspace.list", {})["workspaces"]
        assert [(w["id"], w["state"]) for w in left] == [(second["id"], "active")]
        assert daemon.call("project.get", {"project_id": project["id"]})["project"]["id"]
        until(lambda: not os.path.lexists(first["path"]), timeout=30, message="the retry")
    finally:
        daemon.close()


def test_unarchive_cut_in_its_setup_answers_restored(base: Path) -> None:
    daemon, project, _, ctl = start(base)
    try:
        ws = create(daemon, project["id"], "a")["workspace"]
        (Path(ws["path"]) / "notes.txt").write_text("unsaved\n")
        archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        assert archived["cleanup"]["status"] == "completed", archived["cleanup"]
        (ctl / "setup-started").unlink()
        (ctl / "block-setup").touch()
        thread, out = in_thread(
            lambda: daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
        )
        setup = script_started(ctl, "setup")
        cut(daemon, thread, out)
        assert "error" not in out, f"a restored unarchive answered {out.get('error')}"
        result = out["result"]
        # Restored and active, its setup failed as cut short (as a failing setup is reported).
        assert result["workspace"]["state"] == "active", result["workspace"]
        assert result["setup"]["status"] == "failed", result["setup"]
        assert (
            "cut short" in result["setup"]["error"] and "shutting down" in result["setup"]["error"]
        )
        assert result["restored"]["snapshot"] is not None
        assert (Path(ws["path"]) / "notes.txt").read_text() == "unsaved\n"
        until(lambda: not alive(setup), message="the setup to be stopped")
        (ctl / "block-setup").unlink()
        daemon.start()
        got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
        assert got["state"] == "active" and not got["interrupted"], got
        assert got["setup"]["status"] == "failed"
        assert got["incarnation"] == result["workspace"]["incarnation"]
    finally:
        daemon.close()


# -- cut before anything committed: `shutting_down`, and nothing left ---------------------------


def test_archive_cut_before_its_snapshot_answers_shutting_down(base: Path) -> None:
    point, holds = "workspace.archive.hold", base / "holds"
    daemon, project, repo, _ = start(base, hold_env(point, holds))
    try:
        ws = create(daemon, project["id"], "a")["workspace"]
        (Path(ws["path"]) / "notes.txt").write_text("unsaved\n")
        thread, out = in_thread(
            lambda: daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        )
        wait_held(point, holds)
        cut(daemon, thread, out)
        shutting_down(out)
        daemon.env = {}
        daemon.start()
        got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
        assert got["state"] == "active" and not got["interrupted"], got
        assert (Path(ws["path"]) / "notes.txt").read_text() == "unsaved\n"
        assert snapshot_refs(repo) == []
        assert daemon.call("cleanup.list", {"workspace_id": ws["id"]})["obligations"] == []
    finally:
        daemon.close()


def test_remove_cut_before_its_commit_answers_shutting_down_and_puts_it_back(
    base: Path,
) -> None:
    point, holds = "workspace.remove.hold", base / "holds"
    daemon, project, _, _ = start(base, hold_env(point, holds))
    try:
        ws = create(daemon, project["id"], "a")["workspace"]
        (Path(ws["path"]) / "notes.txt").write_text("unsaved\n")
        thread, out = in_thread(
            lambda: daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
        )
        wait_held(point, holds)
        cut(daemon, thread, out)
        shutting_down(out)
        daemon.env = {}
        daemon.start()
        # Back as it was, not a `removing` row for recovery to flag.
        got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
        assert got["state"] == "active" and not got["interrupted"], got
        assert (Path(ws["path"]) / "notes.txt").read_text() == "unsaved\n"
        assert daemon.call("cleanup.list", {"workspace_id": ws["id"]})["obligations"] == []
    finally:
        daemon.close()


def test_a_client_that_disconnects_mid_archive_does_not_cut_it(base: Path) -> None:
    daemon, project, _, ctl = start(base)
    try:
        ws = create(daemon, project["id"], "a")["workspace"]
        (ctl / "block-teardown").touch()
        with RawPeer(daemon.socket_path) as peer:
            peer.send_json(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "workspace.archive",
                    "params": {"workspace_id": ws["id"]},
                }
            )
            until((ctl / "teardown-started").exists, timeout=30, message="the teardown")
        # The client is gone; the archive goes on to the end (its answer is dropped).
        (ctl / "block-teardown").unlink()
        got = until(lambda: _cleanup_done(daemon, ws["id"]), timeout=30, message="the archive")
        assert not os.path.lexists(ws["path"])
        assert got["state"] == "archived"
        assert got["last_cleanup"]["status"] == "completed", got["last_cleanup"]
        assert (ctl / "torn-down").exists()
        pending = daemon.call("cleanup.list", {"state": "pending"})["obligations"]
        assert [ob["kind"] for ob in pending] in ([], ["reclaim"])  # reclaim: background
    finally:
        daemon.close()


def test_unarchive_cut_before_its_restore_answers_shutting_down_and_stays_archived(
    base: Path,
) -> None:
    point, holds = "workspace.unarchive.hold", base / "holds"
    daemon, project, _, _ = start(base, hold_env(point, holds))
    try:
        ws = create(daemon, project["id"], "a")["workspace"]
        (Path(ws["path"]) / "notes.txt").write_text("unsaved\n")
        daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        thread, out = in_thread(
            lambda: daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
        )
        wait_held(point, holds)
        assert Path(ws["path"]).is_dir()  # recreated; the restore not done
        cut(daemon, thread, out)
        shutting_down(out)
        daemon.env = {}
        daemon.start()
        got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
        assert got["state"] == "archived" and not got["interrupted"], got
        assert not os.path.lexists(ws["path"])  # the undo took the new checkout back
        done = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
        assert done["workspace"]["state"] == "active"
        assert (Path(ws["path"]) / "notes.txt").read_text() == "unsaved\n"
    finally:
        daemon.close()


def test_rename_cut_after_its_move_answers_shutting_down_and_moves_back(base: Path) -> None:
    point, holds = "workspace.rename.hold", base / "holds"
    daemon, project, repo, _ = start(base, hold_env(point, holds))
    try:
        ws = create(daemon, project["id"], "a")["workspace"]
        old = Path(ws["path"])
        (old / "notes.txt").write_text("unsaved\n")
        thread, out = in_thread(
            lambda: daemon.call("workspace.rename", {"workspace_id": ws["id"], "name": "b"})
        )
        wait_held(point, holds)
        assert (old.parent / "b" / "notes.txt").exists()  # moved; not committed yet
        cut(daemon, thread, out)
        shutting_down(out)
        daemon.env = {}
        daemon.start()
        got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
        assert (got["name"], got["path"], got["branch"]) == ("a", str(old), "xum/a"), got
        assert not got["interrupted"]
        assert (old / "notes.txt").read_text() == "unsaved\n"
        assert not (old.parent / "b").exists() and not branch_exists(repo, "xum/b")
    finally:
        daemon.close()


def test_create_cut_in_its_setup_answers_shutting_down_and_leaves_nothing(base: Path) -> None:
    daemon, project, repo, ctl = start(base)
    try:
        (ctl / "block-setup").touch()
        thread, out = in_thread(lambda: create(daemon, project["id"], "c"))
        until((ctl / "setup-started").exists, timeout=30, message="the setup to start")
        cut(daemon, thread, out)
        shutting_down(out)
        (ctl / "block-setup").unlink()
        daemon.start()
        assert daemon.call("workspace.list", {})["workspaces"] == []
        assert not branch_exists(repo, "xum/c")
        assert list((base / "root" / "workspaces").glob("*/c")) == []
        assert list((base / "root" / "workspaces").glob("*/")), "the layout changed"
    finally:
        daemon.close()


def test_turn_create_cut_in_its_targets_setup_answers_shutting_down(base: Path) -> None:
    daemon, project, repo, ctl = start(base)
    try:
        owner = create(daemon, project["id"], "owner")["workspace"]
        (ctl / "setup-started").unlink()
        (ctl / "block-setup").touch()
        params = {"owner_workspace_id": owner["id"], "mode": "new", "name": "sub"}
        thread, out = in_thread(lambda: daemon.call("turn.create", params))
        until((ctl / "setup-started").exists, timeout=30, message="the target's setup")
        cut(daemon, thread, out)
        shutting_down(out)
        (ctl / "block-setup").unlink()
        daemon.start()
        (turn,) = daemon.call("turn.list", {"owner_workspace_id": owner["id"]})["turns"]
        assert turn["state"] == "failed" and "cut short" in turn["reason"], turn
        names = [w["name"] for w in daemon.call("workspace.list", {})["workspaces"]]
        assert names == ["owner"] and not branch_exists(repo, "xum/sub")
    finally:
        daemon.close()


def test_create_cut_before_its_intent_answers_shutting_down(base: Path) -> None:
    point, holds = "workspace.create.hold", base / "holds"
    daemon, project, repo, _ = start(base, hold_env(point, holds))
    try:
        thread, out = in_thread(lambda: create(daemon, project["id"], "c"))
        wait_held(point, holds)
        cut(daemon, thread, out)
        shutting_down(out)
        daemon.env = {}
        daemon.start()
        assert daemon.call("workspace.list", {})["workspaces"] == []
        assert not branch_exists(repo, "xum/c")
    finally:
        daemon.close()


# -- a refusal that did something says so ---------------------------------------------------------


def test_archive_stop_refused_by_an_outside_holder_says_it_stopped(base: Path) -> None:
    import subprocess

    daemon, project, _, _ = start(base)
    editor = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        ws = create(daemon, project["id"], "a")["workspace"]
        term = daemon.call(
            "process.spawn",
            {"workspace_id": ws["id"], "kind": "terminal", "argv": ["sleep", "60"]},
        )["process"]
        daemon.call(
            "lease.acquire",
            {"workspace_id": ws["id"], "kind": "editor", "pid": editor.pid, "label": "vim"},
        )
        with pytest.raises(XumRpcError) as info:
            daemon.call("workspace.archive", {"workspace_id": ws["id"], "stop": True})
        err = info.value
        assert err.data["kind"] == "busy" and [h["pid"] for h in err.data["holders"]] == [
            editor.pid
        ]
        # The terminal was stopped before the refusal, and the answer says so.
        assert "were stopped first" in str(err) and err.data["stopped"], err.data
        got = daemon.call("process.get", {"process_id": term["id"]})["process"]
        assert got["state"] == "exited"
    finally:
        editor.kill()
        editor.wait(10)
        daemon.close()


# -- the mechanism, in process --------------------------------------------------------------------


class _Done(Result):
    done: str


class _Peer:
    id = 1
    pid = None
    uid = None
    protocol = "1.0"

    def notify(self, method: str, params: dict[str, Any]) -> bool:
        return True

    def on_close(self, callback: Callable[[], None]) -> None:
        pass


def _cut_router(method: str, registered_for: str, committed: bool = True) -> dict[str, Any] | None:
    """Run `method` (a handler that commits, then waits forever) and cancel it; what it
    answered, or None when the cancellation went through."""
    from pydantic import Field
    from xum_protocol.models.base import Params

    class _P(Params):
        x: int = Field(default=0)

    router = Router()

    async def handler(params: BaseModel, ctx: Any) -> BaseModel:
        answer_if_cut(lambda: _Done(done="committed") if committed else None, registered_for)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    router.add(method, handler, _P)
    answered: list[dict[str, Any] | None] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                answered.append(
                    await router.handle(
                        {"jsonrpc": "2.0", "method": method, "id": 7, "params": {}}, _Peer()
                    )
                )

            tg.start_soon(call)
            with anyio.fail_after(5):
                while not router.active:
                    await anyio.lowlevel.checkpoint()
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert router.active == 0
    return answered[0] if answered else None


def test_a_committed_request_cut_short_answers_its_result() -> None:
    answer = _cut_router("x.commit", "x.commit")
    assert answer == {"jsonrpc": "2.0", "id": 7, "result": {"done": "committed"}}


def test_a_commit_of_an_inner_operation_does_not_answer_the_outer_request() -> None:
    # A workspace removal inside a project.remove registers for `workspace.remove`: the outer
    # request, cut there, is cancelled (its own result is not that workspace's).
    assert _cut_router("x.outer", "x.inner") is None


def test_a_builder_that_finds_nothing_committed_lets_the_cancellation_through() -> None:
    assert _cut_router("x.commit", "x.commit", committed=False) is None


# -- requests that arrive while the daemon drains --------------------------------------------------


def test_requests_during_the_drains_are_answered(base: Path) -> None:
    """After the grace the request group is gone; a connection still open (until step 4 closes
    it) sends more: each is answered (status served, the rest `shutting_down`), none dropped."""
    from tests.support.holds import release

    point, holds = "daemon.shutdown.hold_drains", base / "holds"
    root = base / "root"
    write_config(root, CONFIG)
    daemon = DaemonProcess(root, env=hold_env(point, holds)).start()
    try:
        with RawPeer(daemon.socket_path) as peer:
            peer.send_json({"jsonrpc": "2.0", "id": "st0", "method": "daemon.status"})
            assert peer.read()["id"] == "st0"
            assert daemon.call("daemon.shutdown") == {"stopping": True}
            wait_held(point, holds)
            peer.send_json({"jsonrpc": "2.0", "id": "st", "method": "daemon.status"})
            peer.send_json({"jsonrpc": "2.0", "id": "ls", "method": "workspace.list"})
            peer.send_json(
                [
                    {"jsonrpc": "2.0", "id": "b1", "method": "workspace.list"},
                    {"jsonrpc": "2.0", "id": "b2", "method": "daemon.status"},
                ]
            )
            answers = [peer.read(), peer.read(), peer.read()]
            release(point, holds)
        single = {a["id"]: a for a in answers if isinstance(a, dict)}
        assert single["st"]["result"]["shutting_down"] is True
        assert single["ls"]["error"]["data"]["kind"] == "shutting_down"
        (batch,) = [a for a in answers if isinstance(a, list)]
        by_id = {item["id"]: item for item in batch}
        assert by_id["b1"]["error"]["data"]["kind"] == "shutting_down"
        assert by_id["b2"]["result"]["shutting_down"] is True
        assert daemon.wait(30) == 0
        assert "server.connection_failed" not in daemon.log_text()
    finally:
        daemon.close()


def _cleanup_done(daemon: DaemonProcess, workspace_id: str) -> dict[str, Any] | None:
    """The workspace once its checkout's cleanup has an outcome: the path goes (the trash
    rename) a moment before that outcome is committed, so waiting on the path races it."""
    got: dict[str, Any] = daemon.call("workspace.get", {"workspace_id": workspace_id})["workspace"]
    cleanup = got.get("last_cleanup") or {}
    return got if cleanup.get("status") not in (None, "pending") else None
