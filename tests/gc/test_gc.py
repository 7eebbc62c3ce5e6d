"""Garbage collection (`gc.plan`, `gc.run`, `xum gc`): each policy against a real daemon, real
git and real files; time moves through the daemon's gc clock (`test.clock_advance`), never by
sleeping; a busy workspace, unsaved work and a crash mid-run (SIGKILL)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xum_client.errors import XumClientError

from tests.cli.test_workspace import xum, xum_json
from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import git, make_repo
from tests.support.holds import hold_env, release, wait_held
from tests.support.lifecycle_helpers import add_project, create, rpc_error
from tests.support.wait import until

DAY = 86400.0
ARCHIVE_HOLD = "workspace.archive.hold"
REMOVE_HOLD = "workspace.remove.hold"
POLICIES = """enable_test_methods = true
[cleanup]
backoff_initial_s = 0.01
[gc]
archived_after_days = 7
snapshot_refs_days = 30
archive_merged = true
kept_after_days = 14
"""


@pytest.fixture
def repo(tmp_short: Path) -> Path:
    repo = make_repo(
        tmp_short / "repo",
        {
            "README.md": "hi\n",
            ".gitignore": ".env\n",
            ".xum/config.toml": '[scripts]\npreserve = [".env"]\n',
        },
    )
    return repo


@pytest.fixture
def gcd(root: Path) -> Iterator[DaemonProcess]:
    write_config(root, POLICIES)
    proc = DaemonProcess(root).start()
    yield proc
    proc.close()


def _advance(daemon: DaemonProcess, days: float) -> None:
    daemon.call("test.clock_advance", {"seconds": days * DAY})


def _keys(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {i["key"]: i for i in plan["items"]}


def _skipped(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["key"]: s for s in plan["skipped"]}


def _merged_workspace(daemon: DaemonProcess, repo: Path, project_id: str, name: str) -> str:
    """A workspace with a commit of its own, merged (fast-forward) into the main checkout."""
    ws = create(daemon, project_id, name)["workspace"]
    path = Path(ws["path"])
    (path / f"{name}.txt").write_text(name + "\n")
    git(path, "add", f"{name}.txt")
    git(path, "commit", "-q", "-m", name)
    git(repo, "merge", "-q", "--no-edit", f"xum/{name}")
    return str(ws["id"])


def test_gc_is_off_by_default(daemon: DaemonProcess, project: dict[str, Any]) -> None:
    ws = create(daemon, project["id"], "a")["workspace"]
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    plan = daemon.call("gc.plan")
    assert plan["items"] == [] and plan["skipped"] == []
    assert plan["policies"] == {
        "archived_after_days": 0,
        "snapshot_refs_days": 0,
        "archive_merged": False,
        "kept_after_days": 0,
        "min_free_bytes": 0,
        "min_free_percent": 0,
        "max_bytes": 0,
        "rebuildable": [],
        "max_workspaces": 0,
        "archive_idle_days": 0,
    }
    assert plan["budget"] == [] and plan["unmet_bytes"] == 0
    assert daemon.call("gc.run")["done"] == []
    assert daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]["state"] == (
        "archived"
    )
    # The clock seam is a test method only.
    assert rpc_error(daemon, "test.clock_advance", {"seconds": 1}).kind == "method_not_found"


def test_archived_workspaces_removed_after_n_days(gcd: DaemonProcess, repo: Path) -> None:
    project = add_project(gcd, repo)
    old = create(gcd, project["id"], "old")["workspace"]
    gcd.call("workspace.archive", {"workspace_id": old["id"]})
    active = create(gcd, project["id"], "active")["workspace"]
    _advance(gcd, 6)
    assert f"remove_archived:{old['id']}" not in _keys(gcd.call("gc.plan"))  # 6 < 7 days
    _advance(gcd, 2)
    plan = gcd.call("gc.plan")
    item = _keys(plan)[f"remove_archived:{old['id']}"]
    assert 8 <= item["age_days"] < 9
    assert set(_keys(plan)) == {f"remove_archived:{old['id']}"}  # never an active one
    result = gcd.call("gc.run")
    assert [d["key"] for d in result["done"]] == [f"remove_archived:{old['id']}"]
    assert rpc_error(gcd, "workspace.get", {"workspace_id": old["id"]}).kind == "not_found"
    assert gcd.call("workspace.get", {"workspace_id": active["id"]})["workspace"]["state"] == (
        "active"
    )
    assert git(repo, "branch", "--list", "xum/old").strip()  # branches are never deleted


def test_snapshot_refs_pruned_after_m_days(gcd: DaemonProcess, repo: Path) -> None:
    project = add_project(gcd, repo)
    ws = create(gcd, project["id"], "snap")["workspace"]
    (Path(ws["path"]) / "work.txt").write_text("unsaved\n")
    archived = gcd.call("workspace.archive", {"workspace_id": ws["id"]})
    ref = archived["snapshot"]["ref"]
    gcd.call("workspace.remove", {"workspace_id": ws["id"]})
    assert git(repo, "rev-parse", "--verify", "--quiet", ref, check=False).strip()
    # A snapshot ref of a workspace the daemon has no record of removing is not provably stale.
    stranger = "refs/xum/snapshots/ws_00000000000000ab/x"
    git(repo, "update-ref", stranger, "HEAD")
    _advance(gcd, 10)
    plan = gcd.call("gc.plan")
    key = f"prune_snapshot_ref:{project['id']}:{ref}"
    assert key not in _keys(plan)
    _advance(gcd, 25)
    plan = gcd.call("gc.plan")
    assert _keys(plan)[key]["ref"] == ref
    assert (
        "not provably stale"
        in _skipped(plan)[f"prune_snapshot_ref:{project['id']}:{stranger}"]["reason"]
    )
    result = gcd.call("gc.run", {"keys": [key]})
    assert [d["key"] for d in result["done"]] == [key]
    assert git(repo, "rev-parse", "--verify", "--quiet", ref, check=False).strip() == ""
    assert git(repo, "rev-parse", "--verify", "--quiet", stranger, check=False).strip()


def test_a_carry_ref_a_crash_left_is_pruned_after_m_days(root: Path, repo: Path) -> None:
    """A create with `carry` killed after its capture (SIGKILL at the point): the start-up pass
    takes the create back, the main checkout still holds the work, and the carry ref is left
    as a second copy. gc prunes it (compare-and-delete) once `snapshot_refs_days` have passed
    since the carry, not before; the main checkout's work is untouched, the interrupted row
    is the user's to remove as before."""
    write_config(root, POLICIES)
    (repo / "README.md").write_text("work in progress\n")
    (repo / "notes.txt").write_text("untracked notes\n")
    first = DaemonProcess(root, env={"XUM_FAULT": "workspace.create.carry.after_capture"}).start()
    try:
        project = add_project(first, repo)
        with pytest.raises(Exception):  # noqa: B017 - the daemon dies at the point: any error
            first.call(
                "workspace.create", {"project_id": project["id"], "name": "c", "carry": "copy"}
            )
        assert first.wait() == -signal.SIGKILL
    finally:
        first.close()
    daemon = DaemonProcess(root).start()
    try:
        [ref] = git(repo, "for-each-ref", "--format=%(refname)", "refs/xum/carry").split()
        [row] = daemon.call("workspace.list")["workspaces"]
        assert (row["state"], row["interrupted"]) == ("creating", True)  # no checkout made
        key = f"prune_carry_ref:{project['id']}:{ref}"
        _advance(daemon, 10)
        assert key not in _keys(daemon.call("gc.plan"))
        _advance(daemon, 25)
        item = _keys(daemon.call("gc.plan"))[key]
        assert item["action"] == "prune_carry_ref", item
        assert "the main checkout still holds it" in item["reason"], item
        result = daemon.call("gc.run", {"keys": [key]})
        assert [d["key"] for d in result["done"]] == [key]
        assert git(repo, "for-each-ref", "refs/xum/carry").strip() == ""
        assert (repo / "README.md").read_text() == "work in progress\n"
        assert (repo / "notes.txt").read_text() == "untracked notes\n"
    finally:
        daemon.close()


def test_archive_merged_clean_only(gcd: DaemonProcess, repo: Path, tmp_short: Path) -> None:
    project = add_project(gcd, repo)
    merged = _merged_workspace(gcd, repo, project["id"], "merged")
    dirty = _merged_workspace(gcd, repo, project["id"], "dirty")
    ws_dirty = gcd.call("workspace.get", {"workspace_id": dirty})["workspace"]
    (Path(ws_dirty["path"]) / "scratch.txt").write_text("not committed\n")
    busy = _merged_workspace(gcd, repo, project["id"], "busy")
    ws_busy = gcd.call("workspace.get", {"workspace_id": busy})["workspace"]
    fresh = create(gcd, project["id"], "fresh")["workspace"]  # no commits of its own
    unmerged = create(gcd, project["id"], "unmerged")["workspace"]
    (Path(unmerged["path"]) / "u.txt").write_text("u\n")
    git(Path(unmerged["path"]), "add", "u.txt")
    git(Path(unmerged["path"]), "commit", "-q", "-m", "u")
    # Something outside the daemon works in `busy`: a process whose cwd is its checkout.
    holder = subprocess.Popen(["sleep", "300"], cwd=ws_busy["path"])
    try:
        plan = gcd.call("gc.plan")
        assert set(_keys(plan)) == {f"archive_merged:{merged}"}
        skipped = _skipped(plan)
        assert skipped[f"archive_merged:{dirty}"]["reason"].startswith("unsaved")
        assert skipped[f"archive_merged:{busy}"]["reason"].startswith("busy")
        assert f"archive_merged:{fresh['id']}" not in skipped
        assert f"archive_merged:{unmerged['id']}" not in skipped
        result = gcd.call("gc.run")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert [d["key"] for d in result["done"]] == [f"archive_merged:{merged}"]
    states = {w["id"]: w["state"] for w in gcd.call("workspace.list")["workspaces"]}
    assert states[merged] == "archived"
    assert states[dirty] == states[busy] == states[fresh["id"]] == "active"
    assert states[unmerged["id"]] == "active"
    assert (Path(ws_dirty["path"]) / "scratch.txt").read_text() == "not committed\n"


def test_leased_workspace_is_skipped_by_the_run(gcd: DaemonProcess, repo: Path) -> None:
    """A live lease (an editor registered on the workspace) holds it: `gc.run` reports it
    skipped as busy and changes nothing."""
    project = add_project(gcd, repo)
    merged = _merged_workspace(gcd, repo, project["id"], "leased")
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        gcd.call(
            "lease.acquire",
            {"workspace_id": merged, "kind": "editor", "pid": sleeper.pid, "label": "vim"},
        )
        result = gcd.call("gc.run")
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
    skipped = _skipped(result)
    assert skipped[f"archive_merged:{merged}"]["reason"].startswith("busy")
    assert result["done"] == []
    assert gcd.call("workspace.get", {"workspace_id": merged})["workspace"]["state"] == "active"


def test_kept_copies_dropped_after_n_days(gcd: DaemonProcess, repo: Path) -> None:
    project = add_project(gcd, repo)
    ws = create(gcd, project["id"], "keeper")["workspace"]
    (Path(ws["path"]) / ".env").write_text("SECRET=1\n")
    removed = gcd.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    kept = Path(removed["kept"]["path"])
    assert kept.is_dir()
    _advance(gcd, 10)
    assert not [k for k in _keys(gcd.call("gc.plan")) if k.startswith("discard_kept:")]
    _advance(gcd, 5)
    plan = gcd.call("gc.plan")
    item = _keys(plan)[f"discard_kept:{kept.name}"]
    assert item["bytes"] > 0
    assert item["path"] == str(kept)
    # A run of chosen keys measures what it collects.
    done = gcd.call("gc.run", {"keys": [item["key"]]})["done"]
    assert [d["key"] for d in done] == [f"discard_kept:{kept.name}"]
    assert done[0]["bytes"] > 0
    assert not kept.exists()


def test_unknown_key_is_reported(gcd: DaemonProcess, repo: Path) -> None:
    add_project(gcd, repo)
    result = gcd.call("gc.run", {"keys": ["archive_merged:ws_00000000000000cd"]})
    assert result["done"] == []
    assert "no longer planned" in result["skipped"][0]["reason"]


def test_a_key_no_plan_can_hold_is_invalid_params(gcd: DaemonProcess, repo: Path) -> None:
    """A key that is not `<action>:<what>` is refused before anything runs, a background run
    included (never recorded), and the valid keys beside it are not collected either."""
    project = add_project(gcd, repo)
    wid = create(gcd, project["id"], "old")["workspace"]["id"]
    gcd.call("workspace.archive", {"workspace_id": wid})
    _advance(gcd, 8)
    good = f"remove_archived:{wid}"
    assert good in _keys(gcd.call("gc.plan"))
    for bad in ("bogus:ws_00000000000000cd", "archive_merged", "remove_archived:"):
        for background in (False, True):
            error = rpc_error(gcd, "gc.run", {"keys": [good, bad], "background": background})
            assert error.kind == "invalid_params" and repr(bad) in error.message
    assert gcd.call("workspace.get", {"workspace_id": wid})["workspace"]["state"] == "archived"
    assert good in _keys(gcd.call("gc.plan"))


def test_crash_mid_gc_is_settled_by_recovery(root: Path, repo: Path) -> None:
    """SIGKILL inside the gc's archive (after its snapshot, before its commit): the restarted
    daemon's startup pass settles the workspace (never left `archiving`), nothing of its work is
    lost, and the next run collects it."""
    write_config(root, POLICIES)
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        wid = _merged_workspace(daemon, repo, project["id"], "crash")
        daemon.close()
        daemon = DaemonProcess(root, env={"XUM_FAULT": "workspace.archive.after_snapshot"}).start()
        with pytest.raises((XumClientError, OSError)):
            daemon.call("gc.run")
        assert daemon.wait() == -signal.SIGKILL
        daemon = DaemonProcess(root).start()
        ws = daemon.call("workspace.get", {"workspace_id": wid})["workspace"]
        assert ws["state"] in ("active", "archived")
        if ws["state"] == "active":
            assert Path(ws["path"]).is_dir()
            if ws["interrupted"]:
                daemon.call("workspace.keep", {"workspace_id": wid})
        result = daemon.call("gc.run")
        final = daemon.call("workspace.get", {"workspace_id": wid})["workspace"]
        assert final["state"] == "archived", result
        assert git(repo, "log", "-1", "--format=%s", "xum/crash").strip() == "crash"
    finally:
        daemon.close()


@pytest.mark.parametrize(
    "point", ["workspace.remove.after_intent", "workspace.remove.after_commit"]
)
def test_crash_mid_gc_removal_is_settled_by_recovery(root: Path, repo: Path, point: str) -> None:
    """SIGKILL inside the gc's removal of an archived workspace, after its intent (`removing`)
    and after its commit: the restarted daemon settles it (archived again, or removed), never
    left `removing`, and the next run leaves nothing of it planned."""
    write_config(root, POLICIES)
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        wid = create(daemon, project["id"], "old")["workspace"]["id"]
        daemon.call("workspace.archive", {"workspace_id": wid})
        daemon.close()
        daemon = DaemonProcess(root, env={"XUM_FAULT": point}).start()
        _advance(daemon, 8)
        with pytest.raises((XumClientError, OSError)):
            daemon.call("gc.run")
        assert daemon.wait() == -signal.SIGKILL
        daemon = DaemonProcess(root).start()
        _advance(daemon, 8)  # the gc clock's offset lives in the daemon: move it again
        listed = {w["id"]: w for w in daemon.call("workspace.list")["workspaces"]}
        assert wid not in listed or listed[wid]["state"] == "archived"
        if wid in listed and listed[wid]["interrupted"]:
            # Cut short mid-way: the plan leaves it (`interrupted`) until someone looks.
            assert (
                "interrupted"
                in _skipped(daemon.call("gc.plan"))[f"remove_archived:{wid}"]["reason"]
            )
            daemon.call("workspace.keep", {"workspace_id": wid})
        daemon.call("gc.run")
        assert rpc_error(daemon, "workspace.get", {"workspace_id": wid}).kind == "not_found"
        assert f"remove_archived:{wid}" not in _keys(daemon.call("gc.plan"))
    finally:
        daemon.close()


def test_background_run_resumes_after_a_crash(root: Path, repo: Path) -> None:
    """`gc.run {background}` is recorded before it starts: SIGKILL in the middle of its first
    item, and the restarted daemon settles the item (startup pass) and finishes the run."""
    write_config(root, POLICIES)
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        first = _merged_workspace(daemon, repo, project["id"], "bg1")
        second = _merged_workspace(daemon, repo, project["id"], "bg2")
        daemon.close()
        daemon = DaemonProcess(root, env={"XUM_FAULT": "workspace.archive.after_snapshot"}).start()
        try:
            started = daemon.call("gc.run", {"background": True})
        except (XumClientError, OSError):
            pytest.fail("the run must be recorded and answered before it starts")
        assert started["state"] == "running"
        run_id = started["run_id"]
        assert daemon.wait() == -signal.SIGKILL
        daemon = DaemonProcess(root).start()
        final = until_done(daemon, run_id)
        states = {w["id"]: w for w in daemon.call("workspace.list")["workspaces"]}
        for wid in (first, second):
            ws = states[wid]
            assert ws["state"] in ("active", "archived")  # never left mid-way
        collected = {d["workspace_id"] for d in final["done"]}
        left = {s["workspace_id"] for s in final["skipped"]}
        assert second in collected  # the item the crash did not reach is done on resume
        assert {first, second} <= collected | left
        assert states[second]["state"] == "archived"
        assert rpc_error(daemon, "gc.get", {"run_id": "ws_0000000000000001"}).kind == (
            "invalid_scope"
        )
        assert rpc_error(daemon, "gc.get", {"run_id": "gc_0000000000000001"}).kind == ("not_found")
    finally:
        daemon.close()


def _held_daemon(root: Path, tmp_short: Path, point: str) -> tuple[DaemonProcess, Path]:
    """A daemon with the gc policies that pauses at the hold `point` (tests/support/holds.py),
    and the directory its holds are signalled in."""
    write_config(root, POLICIES)
    holds = tmp_short / "holds"
    holds.mkdir()
    return DaemonProcess(root, env=hold_env(point, holds)).start(), holds


def test_a_second_run_while_one_runs_is_busy(root: Path, repo: Path, tmp_short: Path) -> None:
    """One gc run at a time: a background run held inside its archive makes `gc.run` refuse
    `busy` at once; the held run then finishes."""
    daemon, holds = _held_daemon(root, tmp_short, ARCHIVE_HOLD)
    try:
        project = add_project(daemon, repo)
        wid = _merged_workspace(daemon, repo, project["id"], "held")
        run_id = daemon.call("gc.run", {"background": True})["run_id"]
        wait_held(ARCHIVE_HOLD, holds)
        assert rpc_error(daemon, "gc.run", {}).kind == "busy"
        assert daemon.call("gc.get", {"run_id": run_id})["state"] == "running"
        release(ARCHIVE_HOLD, holds)
        final = until_done(daemon, run_id)
        assert [d["workspace_id"] for d in final["done"]] == [wid]
    finally:
        daemon.close()


def test_a_workspace_unarchived_after_the_plan_is_not_removed(
    root: Path, repo: Path, tmp_short: Path
) -> None:
    """A run plans, then collects item by item: a workspace the user unarchives while an
    earlier item is collected is no longer what the plan selected (archived), and the run
    leaves it, reported `invalid_state`, instead of removing an active workspace."""
    daemon, holds = _held_daemon(root, tmp_short, REMOVE_HOLD)
    try:
        project = add_project(daemon, repo)
        first = create(daemon, project["id"], "first")["workspace"]["id"]
        second = create(daemon, project["id"], "second")["workspace"]["id"]
        for wid in (first, second):
            daemon.call("workspace.archive", {"workspace_id": wid})
        _advance(daemon, 8)
        run_id = daemon.call("gc.run", {"background": True})["run_id"]
        wait_held(REMOVE_HOLD, holds)  # the first item's removal, after its plan
        daemon.call("workspace.unarchive", {"workspace_id": second})
        release(REMOVE_HOLD, holds)
        final = until_done(daemon, run_id)
        assert [d["workspace_id"] for d in final["done"]] == [first]
        assert _skipped(final)[f"remove_archived:{second}"]["kind"] == "invalid_state"
        ws = daemon.call("workspace.get", {"workspace_id": second})["workspace"]
        assert ws["state"] == "active"
    finally:
        daemon.close()


def until_done(daemon: DaemonProcess, run_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        got = daemon.call("gc.get", {"run_id": run_id})
        return got if got["state"] == "done" else None

    result: dict[str, Any] = until(done, timeout=60, message=f"gc run {run_id} done")
    return result


def test_cli_gc_dry_run_and_run(gcd: DaemonProcess, repo: Path) -> None:
    project = add_project(gcd, repo)
    merged = _merged_workspace(gcd, repo, project["id"], "cli")
    dry = xum(gcd, "gc", "--dry-run").stdout
    assert "would archive_merged: cli" in dry
    assert "archive_merged=True" in dry
    assert gcd.call("workspace.get", {"workspace_id": merged})["workspace"]["state"] == "active"
    run = xum(gcd, "gc").stdout
    assert "archive_merged cli: done" in run
    assert "1 collected" in run
    assert gcd.call("workspace.get", {"workspace_id": merged})["workspace"]["state"] == ("archived")
    assert xum_json(gcd, "gc")["done"] == []
    started = xum(gcd, "gc", "--background").stdout
    run_id = started.split()[2]
    until_done(gcd, run_id)
    assert "0 collected" in xum(gcd, "gc", "--status", run_id).stdout
