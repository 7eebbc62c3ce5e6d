"""The disk budget's later steps, forced by `[gc] max_workspaces` (a project's workspaces that
hold a checkout): an archived workspace whose checkout lingers (its teardown failing, its retry
far off) has its cleanup run now (`collect_checkout`), refused with why while it still fails;
with `archive_idle_days`, an idle clean workspace is archived (`archive_idle`, snapshot first),
a dirty one is skipped as unsaved, a recently changed one is not chosen, and what no step can
cover is left unmet. A create at the limit has the lingering checkout collected before its
intent row, or is refused `conflict` when it cannot be."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_workspace import xum
from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import add_project, create, failing_teardown, rpc_error

SLOW_RETRY = "[cleanup]\nbackoff_initial_s = 3600\nbackoff_max_s = 3600\n"


@pytest.fixture
def repo(tmp_short: Path, ctl: Path) -> Path:
    made = make_repo(tmp_short / "repo", {"README.md": "hi\n", ".gitignore": "build/\n"})
    (made / ".xum").mkdir()
    (made / ".xum" / "config.toml").write_text(
        f"[scripts]\nteardown = [{json.dumps(failing_teardown(ctl))}]\n"
    )
    git(made, "add", ".xum/config.toml")
    git(made, "commit", "-q", "-m", "teardown")
    return made


def _restart(daemon: DaemonProcess, root: Path, gc: str) -> DaemonProcess:
    daemon.close()
    write_config(root, f"{SLOW_RETRY}[gc]\n{gc}budget_interval_s = 3600\n")
    return DaemonProcess(root).start()


def _age(path: Path, days: float) -> None:
    then = os.stat(path / "README.md").st_mtime - days * 86400
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            os.utime(os.path.join(dirpath, name), (then, then), follow_symlinks=False)


def _start(root: Path, repo: Path, names: list[str]) -> tuple[DaemonProcess, dict[str, Any]]:
    write_config(root, SLOW_RETRY)
    daemon = DaemonProcess(root).start()
    project = add_project(daemon, repo)
    daemon.call("project.trust", {"project_id": project["id"]})
    made = {name: create(daemon, project["id"], name)["workspace"] for name in names}
    return daemon, made


def test_an_archived_workspaces_lingering_checkout_is_collected(
    root: Path, repo: Path, ctl: Path
) -> None:
    daemon, made = _start(root, repo, ["a", "b"])
    try:
        archived = daemon.call("workspace.archive", {"workspace_id": made["a"]["id"]})
        assert archived["cleanup"]["status"] == "pending", archived
        path = Path(made["a"]["path"])
        assert path.is_dir()  # the teardown failed: the checkout lingers, retried in an hour
        daemon = _restart(daemon, root, "max_workspaces = 1\n")
        plan = daemon.call("gc.plan")
        [part] = [p for p in plan["budget"] if p["what"] == "workspaces"]
        assert (part["workspaces"], part["excess_workspaces"]) == (2, 1), part
        key = f"collect_checkout:{made['a']['id']}"
        assert [i["key"] for i in plan["items"]] == [key], plan
        assert plan["items"][0]["bytes"] > 0
        # Still failing: refused with why, nothing lost.
        result = daemon.call("gc.run", {"keys": [key]})
        [skip] = result["skipped"]
        assert "did not remove" in skip["reason"] and skip["kind"] == "busy", skip
        assert path.is_dir()
        (ctl / "ok").touch()
        result = daemon.call("gc.run", {"keys": [key]})
        assert [d["key"] for d in result["done"]] == [key], result
        assert not os.path.lexists(path)
        plan = daemon.call("gc.plan")
        [part] = [p for p in plan["budget"] if p["what"] == "workspaces"]
        assert part["excess_workspaces"] == 0 and plan["unmet_bytes"] == 0, plan
        assert daemon.call("daemon.status")["details"]["gc"]["budget"].startswith("holds")
        [line] = [x for x in xum(daemon, "du").stdout.splitlines() if x.startswith("budget ")]
        assert line.endswith("1 workspace(s) with a checkout ([gc] max_workspaces): holds"), line
    finally:
        daemon.close()


def test_idle_clean_workspaces_are_archived_dirty_ones_skipped(
    root: Path, repo: Path, ctl: Path
) -> None:
    (ctl / "ok").touch()  # teardowns pass: an archive completes
    daemon, made = _start(root, repo, ["a", "b", "c"])
    try:
        (Path(made["c"]["path"]) / "notes.txt").write_text("unsaved\n")
        _age(Path(made["a"]["path"]), 3)
        _age(Path(made["c"]["path"]), 3)
        daemon = _restart(daemon, root, "max_workspaces = 1\narchive_idle_days = 1\n")
        plan = daemon.call("gc.plan")
        a, b, c = (made[n]["id"] for n in ("a", "b", "c"))
        assert [i["key"] for i in plan["items"]] == [f"archive_idle:{a}"], plan
        assert "unused for 3.0 days" in plan["items"][0]["reason"]
        skipped = {s["key"]: s["reason"] for s in plan["skipped"]}
        assert skipped[f"archive_idle:{c}"].startswith("unsaved"), skipped
        assert f"archive_idle:{b}" not in skipped  # used just now: not a candidate at all
        [part] = [p for p in plan["budget"] if p["what"] == "workspaces"]
        assert part["excess_workspaces"] == 2
        result = daemon.call("gc.run")
        assert [d["key"] for d in result["done"]] == [f"archive_idle:{a}"], result
        got = daemon.call("workspace.get", {"workspace_id": a})["workspace"]
        assert got["state"] == "archived"
        assert (Path(made["c"]["path"]) / "notes.txt").read_text() == "unsaved\n"
        plan = daemon.call("gc.plan")
        [part] = [p for p in plan["budget"] if p["what"] == "workspaces"]
        assert part["excess_workspaces"] == 1  # b in use, c unsaved: unmet
        status = daemon.call("daemon.status")["details"]["gc"]["budget"]
        assert status.startswith("cannot be met") and "too many" in status, status
    finally:
        daemon.close()


def test_a_create_at_max_workspaces_has_a_lingering_checkout_collected_first(
    root: Path, repo: Path, ctl: Path
) -> None:
    """The project is at `max_workspaces` with an archived workspace whose checkout lingers (its
    retry an hour away): a create asks gc to make room before its intent row; the archived
    workspace's pending cleanup runs now, and the create proceeds."""
    daemon, made = _start(root, repo, ["a"])
    try:
        daemon.call("workspace.archive", {"workspace_id": made["a"]["id"]})
        path = Path(made["a"]["path"])
        assert path.is_dir()
        (ctl / "ok").touch()  # the teardown would pass now; its retry is an hour away
        daemon = _restart(daemon, root, "max_workspaces = 1\n")
        assert daemon.call("gc.plan", {"budget_only": True})["budget"][0]["workspaces"] == 1
        assert path.is_dir()
        created = create(daemon, made["a"]["project_id"], "b")
        assert not os.path.lexists(path)  # collected before the create answered
        [told] = created["evicted"]  # and the answer says so
        assert (told["action"], told["workspace_id"]) == ("collect_checkout", made["a"]["id"])
        assert told["bytes"] > 0, told
        assert Path(created["workspace"]["path"]).is_dir()
        plan = daemon.call("gc.plan", {"budget_only": True})
        [part] = [p for p in plan["budget"] if p["what"] == "workspaces"]
        assert (part["workspaces"], part["excess_workspaces"]) == (1, 0), part
    finally:
        daemon.close()


def test_a_create_at_max_workspaces_is_refused_when_nothing_can_be_collected(
    root: Path, repo: Path, ctl: Path
) -> None:
    """The archived workspace's teardown still fails: gc cannot collect its checkout, so the
    create is refused `conflict` before its intent row, naming the limit, the count and the
    lingering checkout; an active workspace is never archived for it."""
    daemon, made = _start(root, repo, ["a", "b"])
    try:
        daemon.call("workspace.archive", {"workspace_id": made["a"]["id"]})
        daemon = _restart(daemon, root, "max_workspaces = 2\n")
        project_id = made["a"]["project_id"]
        error = rpc_error(daemon, "workspace.create", {"project_id": project_id, "name": "c"})
        assert error.kind == "conflict", error
        assert error.data["max_workspaces"] == 2 and error.data["workspaces"] == 2, error.data
        assert error.data["lingering"] == ["a"], error.data
        assert "max_workspaces is 2" in str(error) and "did not remove" in str(error), str(error)
        names = {w["name"]: w["state"] for w in daemon.call("workspace.list")["workspaces"]}
        assert names == {"a": "archived", "b": "active"}, names  # no row for c, b untouched
        assert Path(made["a"]["path"]).is_dir() and Path(made["b"]["path"]).is_dir()
        # Once the teardown passes, the same create collects a's checkout and proceeds.
        (ctl / "ok").touch()
        create(daemon, project_id, "c")
        assert not os.path.lexists(made["a"]["path"])
    finally:
        daemon.close()


def test_an_unarchive_at_max_workspaces_is_refused_or_makes_room_first(
    root: Path, repo: Path, ctl: Path
) -> None:
    """Unarchive gives a workspace its checkout back, so it counts as a create does: at the
    limit with nothing to collect it is refused `conflict` with the workspace left archived (no
    checkout made, no state changed); at the limit with a lingering archived checkout gc may
    collect, that checkout goes first, the unarchive goes through, and its answer says what
    was collected."""
    (ctl / "ok").touch()  # a's teardown passes: its checkout goes at its archive
    daemon, made = _start(root, repo, ["a", "b"])
    try:
        daemon.call("workspace.archive", {"workspace_id": made["a"]["id"]})
        assert not os.path.lexists(made["a"]["path"])
        (ctl / "ok").unlink()  # teardowns fail from here
        daemon = _restart(daemon, root, "max_workspaces = 1\n")
        error = rpc_error(daemon, "workspace.unarchive", {"workspace_id": made["a"]["id"]})
        assert error.kind == "conflict", error
        assert error.data["max_workspaces"] == 1 and error.data["workspaces"] == 1, error.data
        names = {w["name"]: w["state"] for w in daemon.call("workspace.list")["workspaces"]}
        assert names == {"a": "archived", "b": "active"}, names
        assert not os.path.lexists(made["a"]["path"])
        daemon.call("workspace.archive", {"workspace_id": made["b"]["id"]})
        assert Path(made["b"]["path"]).is_dir()  # lingers: its teardown failed
        (ctl / "ok").touch()  # it would pass now; its retry is an hour away
        back = daemon.call("workspace.unarchive", {"workspace_id": made["a"]["id"]})
        assert back["workspace"]["state"] == "active"
        assert Path(made["a"]["path"]).is_dir() and not os.path.lexists(made["b"]["path"])
        [told] = back["evicted"]
        assert (told["action"], told["workspace_id"]) == ("collect_checkout", made["b"]["id"])
    finally:
        daemon.close()
