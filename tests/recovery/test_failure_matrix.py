"""The failure matrix: for every fault point the daemon declares, arm it
in `raise` mode (`XUM_FAULT=<point>:raise`: an unexpected exception there, not a SIGKILL), drive
the operation that reaches it with the crash matrix's drivers, and check, *without a restart*,
what the crash matrix checks after one: no row left `archiving`, `restoring`, `removing` or
`creating` unflagged; a flagged row carries its reason; nothing lost; then keep / remove / retry
with ordinary calls complete or undo the operation. A point with no driver fails
tests/recovery/test_crash_matrix.py. The full matrix is `reliability`; a sample runs in `make
test`."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.crash.drivers import driver_for
from tests.crash.invariants import check, resolve
from tests.crash.world import World
from tests.recovery.test_crash_matrix import POINTS
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import create, rpc_error, trusted_daemon
from tests.support.wait import until

SAMPLE = {
    "workspace.archive.after_intent",
    "workspace.archive.after_snapshot",
    "workspace.remove.after_intent",
    "workspace.unarchive.after_setup",
    "workspace.unarchive.undo.after_discard",
    "workspace.create.undo.after_discard",
    "workspace.rename.after_journal",
}


def _params() -> list[object]:
    return [
        pytest.param(p, marks=() if p in SAMPLE else (pytest.mark.reliability,)) for p in POINTS
    ]


def test_sample_points_exist() -> None:
    assert set(POINTS) >= SAMPLE, SAMPLE - set(POINTS)


@pytest.mark.parametrize("point", _params())
def test_raise_at(point: str, world: World) -> None:
    driver = driver_for(point)
    assert driver is not None, f"no driver for fault point {point}"
    world.raise_at = point
    run = driver(world, point)
    reached = f"fault point {point} reached; raising"
    if world.d.proc is not None and world.d.proc.poll() is None:
        # A background step (a reclaim) may reach its point after the call answered.
        until(lambda: reached in world.d.log_text(), timeout=30, message=reached)
    assert reached in world.d.log_text()
    if world.d.proc is None or world.d.proc.poll() is not None:
        world.start()  # a raise in the startup pass: the next start completes it
    else:
        assert world.call("daemon.status", {})  # still serving
    world.raise_at = None
    for w in world.workspaces():
        assert w["state"] not in ("archiving", "restoring", "removing"), w
        assert w["state"] != "creating" or w["interrupted"], w
        if w["interrupted"]:
            assert w["interrupted_reason"], f"{w['name']} is flagged without a reason"
    if any(_kept_journal(w) for w in world.workspaces()):
        # A rename whose undo failed stays between two names on disk, flagged, its journal
        # kept: the way out is workspace.keep (recovery's settle), which resolve() calls.
        resolve(world)
    problems = check(world, run.before, where=f"{point}: after the failure")
    assert not problems, "\n".join(problems)
    resolve(world)
    run.finish(world)
    world.finish_cleanup()
    problems = check(world, run.before, where=f"{point}: after the user finished")
    assert not problems, "\n".join(problems)
    assert not [w for w in world.workspaces() if w["interrupted"]]


def _kept_journal(w: dict[str, Any]) -> bool:
    return bool(w["interrupted"]) and "rename journal is kept" in (w["interrupted_reason"] or "")


def test_a_refusal_never_settles_a_create_in_flight(tmp_short: Path, ctl: Path) -> None:
    """While a create runs its setup (row `creating`, unflagged, no exclusive reservation
    held), archive/remove/rename/keep/unarchive of that row are refused; their failure guard
    must leave the create's row alone (it is mid-way, but not theirs), and the create then
    finishes `active`."""
    repo = make_repo(tmp_short / "repo")
    wait = f"while [ ! -f {ctl}/ok ]; do sleep 0.05; done"
    (repo / ".xum").mkdir()
    (repo / ".xum" / "config.toml").write_text(f"[scripts]\nsetup = [{json.dumps(wait)}]\n")
    git(repo, "add", ".xum/config.toml")
    git(repo, "commit", "-q", "-m", "setup")
    with trusted_daemon(tmp_short / "root", repo, "") as (daemon, project):
        answer: list[Any] = []
        worker = threading.Thread(
            target=lambda: answer.append(create(daemon, project["id"], "slow")), daemon=True
        )
        worker.start()

        def running() -> dict[str, Any] | None:
            for w in daemon.call("workspace.list", {})["workspaces"]:
                if w["name"] == "slow" and w["setup"]["status"] == "running":
                    return dict(w)
            return None

        ws = until(running, timeout=30, message="the create's setup to run")
        wid = ws["id"]
        for method, params in (
            ("workspace.archive", {"workspace_id": wid}),
            ("workspace.remove", {"workspace_id": wid, "force": True}),
            ("workspace.rename", {"workspace_id": wid, "name": "other"}),
            ("workspace.keep", {"workspace_id": wid}),
            ("workspace.unarchive", {"workspace_id": wid}),
        ):
            err = rpc_error(daemon, method, params)
            assert err.kind == "invalid_state", (method, err)
            now = daemon.call("workspace.get", {"workspace_id": wid})["workspace"]
            assert now["state"] == "creating" and not now["interrupted"], (method, now)
        (ctl / "ok").touch()
        worker.join(timeout=60)
        assert answer and answer[0]["workspace"]["state"] == "active", answer
