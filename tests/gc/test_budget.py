"""The disk budget (`[gc] min_free_bytes`, `rebuildable`): on a real tmpfs small enough to fill,
with workspaces whose `node_modules/` hold real files. The plan evicts the rebuildable
directories of idle workspaces least recently used first, just enough to restore the budget;
a busy workspace is skipped with why; an eviction goes through the trash and its reclaim; a
SIGKILL after the eviction's intent or after its move is settled at the next start."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xum_client.errors import XumClientError
from xum_protocol.models.daemon import GcStatus

from tests.cli.test_workspace import xum
from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project, create, rpc_error
from tests.support.tmpfs import tmpfs
from tests.support.wait import until

MB = 1 << 20
PACKAGE = 6 * MB
"""Bytes of real files in each workspace's node_modules."""


@pytest.fixture
def fs(tmp_short: Path) -> Iterator[Path]:
    with tmpfs(tmp_short / "fs", "size=96m") as mount:
        yield mount


def budget_repo(where: Path) -> Path:
    """A repository whose node_modules/ and .cache/ are ignored (rebuildable)."""
    return make_repo(
        where,
        {"README.md": "hi\n", "src.txt": "code\n", ".gitignore": "node_modules/\n.cache/\n"},
    )


@pytest.fixture
def repo(tmp_short: Path) -> Path:
    return budget_repo(tmp_short / "repo")


def _lease(daemon: DaemonProcess, workspace_id: str, pid: int) -> dict[str, Any]:
    """An editor's lease on the workspace, held by the live process `pid`."""
    answer: dict[str, Any] = daemon.call(
        "lease.acquire",
        {"workspace_id": workspace_id, "kind": "editor", "pid": pid, "label": "vim"},
    )
    return answer


def _config(root: Path, min_free: int, interval_s: float = 3600) -> None:
    write_config(
        root,
        f"""enable_test_methods = true
[cleanup]
backoff_initial_s = 0.01
[gc]
min_free_bytes = {min_free}
rebuildable = ["node_modules/"]
idle_after_s = 60
budget_interval_s = {interval_s}
""",
    )


def _workspace(daemon: DaemonProcess, project_id: str, name: str, age_s: float) -> dict[str, Any]:
    """A workspace with `PACKAGE` bytes in node_modules/ and its own files last changed
    `age_s` ago."""
    ws: dict[str, Any] = create(daemon, project_id, name)["workspace"]
    path = Path(ws["path"])
    (path / "node_modules" / "pkg").mkdir(parents=True)
    (path / "node_modules" / "pkg" / "index.js").write_bytes(os.urandom(PACKAGE))
    (path / ".cache").mkdir()
    (path / ".cache" / "c").write_bytes(b"x" * 4096)
    then = os.stat(path / "README.md").st_mtime - age_s
    for name_ in ("README.md", "src.txt", ".gitignore", ".cache/c"):
        os.utime(path / name_, (then, then))
    return ws


def _free(mount: Path) -> int:
    vfs = os.statvfs(mount)
    return vfs.f_bavail * vfs.f_frsize


def _start(root: Path, fs: Path, repo: Path) -> tuple[DaemonProcess, dict[str, dict[str, Any]]]:
    """Three idle workspaces (a oldest, c newest) on the tmpfs; a budget lacking ~1.5 packages."""
    _config(root, 0)
    daemon = DaemonProcess(root).start()
    project = add_project(daemon, repo)
    made = {
        "a": _workspace(daemon, project["id"], "a", 3 * 86400),
        "b": _workspace(daemon, project["id"], "b", 2 * 86400),
        "c": _workspace(daemon, project["id"], "c", 1 * 86400),
    }
    daemon.close()
    _config(root, _free(fs) + PACKAGE + PACKAGE // 2)
    return DaemonProcess(root).start(), made


@pytest.fixture
def rooted(fs: Path) -> Path:
    return fs / "r"


def test_budget_restored_by_eviction_in_lru_order(rooted: Path, fs: Path, repo: Path) -> None:
    daemon, made = _start(rooted, fs, repo)
    try:
        plan = daemon.call("gc.plan")
        [part] = [p for p in plan["budget"] if p["filesystem"] == str(fs)]
        assert part["deficit_bytes"] > PACKAGE
        keys = [i["key"] for i in plan["items"]]
        # Least recently used first, and just enough: a and b, never c.
        assert keys == [
            f"evict_rebuildable:{made['a']['id']}:node_modules",
            f"evict_rebuildable:{made['b']['id']}:node_modules",
        ], plan
        assert all(i["bytes"] >= PACKAGE for i in plan["items"])
        assert "idle" in plan["items"][0]["reason"]
        assert plan["unmet_bytes"] == 0
        before = _free(fs)
        result = daemon.call("gc.run")
        assert [d["key"] for d in result["done"]] == keys, result
        for name in ("a", "b"):
            path = Path(made[name]["path"])
            assert not (path / "node_modules").exists()
            assert (path / "README.md").read_text() == "hi\n"  # the work is untouched
            assert (path / ".cache" / "c").exists()  # ignored but not rebuildable: kept
        assert (Path(made["c"]["path"]) / "node_modules" / "pkg" / "index.js").exists()
        # Reclaimed through the trash: the space comes back (less what the store's log grew
        # by) and the budget holds.
        until(lambda: _free(fs) >= before + 2 * PACKAGE - MB, message="the evictions reclaimed")
        plan = daemon.call("gc.plan")
        assert plan["items"] == [], plan
        assert all(p["deficit_bytes"] == 0 for p in plan["budget"]), plan
    finally:
        daemon.close()


def test_busy_workspace_is_skipped_with_the_reason(rooted: Path, fs: Path, repo: Path) -> None:
    daemon, made = _start(rooted, fs, repo)
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        held = made["a"]["id"]
        _lease(daemon, held, sleeper.pid)
        plan = daemon.call("gc.plan")
        skipped = {s["key"]: s for s in plan["skipped"]}
        assert skipped[f"evict_rebuildable:{held}"]["reason"].startswith("busy"), plan
        keys = [i["key"] for i in plan["items"]]
        assert keys == [
            f"evict_rebuildable:{made['b']['id']}:node_modules",
            f"evict_rebuildable:{made['c']['id']}:node_modules",
        ], plan
        # Its holder gone, and the gc clock stepped two days ahead: seen held moments ago by
        # the monotonic clock, so still in use for idle_after_s; nothing of it is evicted.
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
        daemon.call("test.clock_advance", {"seconds": 2 * 86400})

        def reason() -> str:
            plan = daemon.call("gc.plan")
            found = {s["key"]: s["reason"] for s in plan["skipped"]}
            return str(found.get(f"evict_rebuildable:{held}", ""))

        assert until(lambda: reason().startswith("in use: held"), message="the lease gone")
        daemon.call("gc.run")
        assert (Path(made["a"]["path"]) / "node_modules" / "pkg" / "index.js").exists()
    finally:
        if sleeper.poll() is None:
            sleeper.send_signal(signal.SIGKILL)
            sleeper.wait()
        daemon.close()


def test_recently_changed_workspace_is_in_use(rooted: Path, fs: Path, repo: Path) -> None:
    """A file changed within idle_after_s outside node_modules: in use, not evicted."""
    daemon, made = _start(rooted, fs, repo)
    try:
        os.utime(Path(made["a"]["path"]) / "src.txt")  # now
        plan = daemon.call("gc.plan")
        skipped = {s["key"]: s for s in plan["skipped"]}
        assert skipped[f"evict_rebuildable:{made['a']['id']}"]["reason"].startswith("in use")
        assert f"evict_rebuildable:{made['a']['id']}:node_modules" not in [
            i["key"] for i in plan["items"]
        ]
    finally:
        daemon.close()


@pytest.mark.parametrize("point", ["gc.evict.after_intent", "gc.evict.after_move"])
def test_crash_during_eviction_is_recovered(rooted: Path, fs: Path, repo: Path, point: str) -> None:
    daemon, made = _start(rooted, fs, repo)
    daemon.close()
    daemon = DaemonProcess(rooted, env={"XUM_FAULT": point}).start()
    with pytest.raises((XumClientError, OSError)):
        daemon.call("gc.run")
    assert daemon.wait() == -signal.SIGKILL
    daemon = DaemonProcess(rooted).start()
    try:
        modules = Path(made["a"]["path"]) / "node_modules"
        if point == "gc.evict.after_intent":
            assert (modules / "pkg" / "index.js").stat().st_size == PACKAGE  # nothing moved
        else:
            assert not modules.exists()
        # Whatever was moved is reclaimed; no trash entry is left behind; the next run
        # restores the budget.
        daemon.call("gc.run")
        until(
            lambda: not any((rooted / "trash").iterdir()) if (rooted / "trash").is_dir() else True,
            message="the trash emptied",
        )
        until(lambda: daemon.call("gc.plan")["unmet_bytes"] == 0, message="the budget held")
        assert (Path(made["c"]["path"]) / "README.md").exists()
    finally:
        daemon.close()


def test_a_create_that_would_overflow_is_refused_before_writing(
    rooted: Path, fs: Path, tmp_short: Path
) -> None:
    """The base's tree (4 MiB of tracked files) against the budget: refused `disk_full` before
    the intent row, naming the filesystem, the need and the free space; nothing is made."""
    big = make_repo(tmp_short / "big", {"README.md": "hi\n", "blob.bin": "x" * (4 * MB)})
    _config(rooted, 0)
    daemon = DaemonProcess(rooted).start()
    try:
        project = add_project(daemon, big)
        daemon.close()
        _config(rooted, _free(fs) - 2 * MB)
        daemon = DaemonProcess(rooted).start()
        error = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "over"})
        assert error.kind == "disk_full", error
        assert error.data["filesystem"] == str(fs), error.data
        assert error.data["need_bytes"] >= 4 * MB, error.data
        assert "gc --dry-run" in str(error)
        assert daemon.call("workspace.list")["workspaces"] == []
        assert not (rooted / "workspaces" / "big" / "over").exists()
        daemon.close()
        _config(rooted, 0)
        daemon = DaemonProcess(rooted).start()
        create(daemon, project["id"], "fits")  # without the budget it fits
    finally:
        daemon.close()


def test_a_create_that_would_overflow_evicts_first_then_proceeds(
    rooted: Path, fs: Path, repo: Path
) -> None:
    """The budget already lacks ~1.5 packages: the create asks gc to make room, which evicts
    the least recently used workspaces' node_modules and reclaims them at once; the create then
    proceeds, and its result lists what was evicted."""
    daemon, made = _start(rooted, fs, repo)
    try:
        project_id = made["a"]["project_id"]
        before = _free(fs)
        result = create(daemon, project_id, "d")
        keys = [e["key"] for e in result["evicted"]]
        assert keys == [
            f"evict_rebuildable:{made['a']['id']}:node_modules",
            f"evict_rebuildable:{made['b']['id']}:node_modules",
        ], result["evicted"]
        assert all(e["bytes"] >= PACKAGE for e in result["evicted"])
        # Reclaimed before the create wrote: the space is back, not owed.
        assert _free(fs) >= before + 2 * PACKAGE - 2 * MB
        assert (Path(made["c"]["path"]) / "node_modules" / "pkg" / "index.js").exists()
        assert (Path(made["a"]["path"]) / "README.md").read_text() == "hi\n"
        assert Path(result["workspace"]["path"]).is_dir()
    finally:
        daemon.close()


def test_a_create_refused_when_everything_is_busy(rooted: Path, fs: Path, repo: Path) -> None:
    """Every workspace holds a lease: gc may collect nothing, so the create is refused
    `disk_full` before writing, naming what was left alone and why."""
    daemon, made = _start(rooted, fs, repo)
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        for ws in made.values():
            _lease(daemon, ws["id"], sleeper.pid)
        project_id = made["a"]["project_id"]
        error = rpc_error(daemon, "workspace.create", {"project_id": project_id, "name": "d"})
        assert error.kind == "disk_full", error
        assert error.data["freed_bytes"] == 0, error.data
        assert "left alone" in str(error) and "busy" in str(error), str(error)
        assert len(daemon.call("workspace.list")["workspaces"]) == 3  # nothing was made
        for ws in made.values():
            assert (Path(ws["path"]) / "node_modules" / "pkg" / "index.js").exists()
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
        daemon.close()


def test_an_unmet_budget_is_reported_once_naming_the_largest_holders(
    rooted: Path, fs: Path, repo: Path
) -> None:
    """Everything is busy: the scheduled check (every 0.1 s here) finds nothing to collect;
    `gc.budget_exceeded` is logged once for the episode, naming the holders largest first, and
    `daemon.status` says the budget cannot be met; the checks go on without repeating it."""
    daemon, made = _start(rooted, fs, repo)
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        # Held before the checks begin: a lease names a live process, so it outlives the
        # restart that sets the short interval.
        for ws in made.values():
            _lease(daemon, ws["id"], sleeper.pid)
        daemon.close()
        big = Path(made["b"]["path"]) / "big.bin"
        big.write_bytes(os.urandom(4 * MB))  # b's checkout is the largest
        then = os.stat(Path(made["b"]["path"]) / "README.md").st_mtime
        os.utime(big, (then, then))
        _config(rooted, _free(fs) + PACKAGE + PACKAGE // 2, interval_s=0.1)
        daemon = DaemonProcess(rooted).start()

        def budget() -> str:
            details = daemon.call("daemon.status")["details"]
            return GcStatus.model_validate(details["gc"]).budget

        until(lambda: budget().startswith("cannot be met"), message="the check ran")
        until(
            lambda: daemon.log_text().count("gc.budget_checked") >= 5,
            message="more checks ran",
        )
        lines = [line for line in daemon.log_text().splitlines() if "gc.budget_exceeded" in line]
        assert len(lines) == 1, lines
        holders = lines[0].split("holders", 1)[1]
        assert holders.index(made["b"]["id"]) < holders.index(made["a"]["id"]), lines[0]
        assert str(fs) in budget()
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
        daemon.close()


def test_du_and_gc_dry_run_show_the_budget(rooted: Path, fs: Path, repo: Path) -> None:
    """`xum du` shows each filesystem against the budget; `xum gc --dry-run` the plan's bytes
    and the budget; after the run, both show it holding."""
    daemon, made = _start(rooted, fs, repo)
    try:
        du = xum(daemon, "du").stdout
        [line] = [x for x in du.splitlines() if x.startswith(f"budget {fs}:")]
        assert "exceeded: lacks" in line, du
        dry = xum(daemon, "gc", "--dry-run").stdout
        assert f"would evict_rebuildable: {made['a']['name']} (6.0 MiB;" in dry, dry
        assert dry.count("would evict_rebuildable") == 2, dry
        assert "12.0 MiB freed" in dry and f"budget {fs}:" in dry, dry
        daemon.call("gc.run")
        until(lambda: "holds" in xum(daemon, "gc", "--dry-run").stdout, message="the budget held")
        [line] = [x for x in xum(daemon, "du").stdout.splitlines() if x.startswith("budget ")]
        assert "holds" in line, line
    finally:
        daemon.close()


def test_a_released_lease_keeps_the_workspace_in_use_across_a_restart(
    rooted: Path, fs: Path, repo: Path
) -> None:
    """The oldest workspace's lease is released and the daemon restarted (its in-memory
    activity gone): the store's record of the lease keeps it in use for idle_after_s; once the
    gc clock passes that, it is the least recently used again."""
    daemon, made = _start(rooted, fs, repo)
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        held = made["a"]["id"]
        lease = _lease(daemon, held, sleeper.pid)
        daemon.call("lease.release", {"lease_id": lease["lease"]["id"]})
        daemon.close()
        daemon = DaemonProcess(rooted).start()
        plan = daemon.call("gc.plan")
        skipped = {s["key"]: s["reason"] for s in plan["skipped"]}
        assert skipped[f"evict_rebuildable:{held}"].startswith("in use: its last lease went")
        assert f"evict_rebuildable:{held}:node_modules" not in [i["key"] for i in plan["items"]]
        daemon.call("test.clock_advance", {"seconds": 120})  # past idle_after_s (60)
        plan = daemon.call("gc.plan")
        # Last used (its lease) after b's and c's files last changed: the most recent now.
        keys = [i["key"] for i in plan["items"]]
        assert keys == [
            f"evict_rebuildable:{made['b']['id']}:node_modules",
            f"evict_rebuildable:{made['c']['id']}:node_modules",
        ], plan
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
        daemon.close()
