"""A create against `[gc] max_bytes` and `max_workspaces` before its intent row, through a real
daemon: refused `disk_full` naming `max_bytes` when the root would hold more (measured, never on
the cheap figure alone), room made first by evicting an idle workspace's rebuildable directory,
a cheap figure that says "cross" measured again before deciding, two creates at once that would
each fit alone but not together (the first one's reservation), and two concurrent creates at
one place below `max_workspaces` (the second refused `conflict` inside the intent transaction)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.test_request_keys import ask
from tests.gc.test_budget import PACKAGE
from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import make_repo
from tests.support.holds import hold_env, release, wait_held
from tests.support.lifecycle_helpers import add_project, create, rpc_error
from tests.support.tmpfs import tmpfs
from tests.support.wait import until

MB = 1 << 20
TREE = 4 * MB
HOLD = "workspace.create.hold"


@pytest.fixture
def big(tmp_short: Path) -> Path:
    """A repository whose tree is 4 MiB (what each checkout writes)."""
    return make_repo(
        tmp_short / "big",
        {"README.md": "hi\n", "blob.bin": "x" * TREE, ".gitignore": "node_modules/\n"},
    )


def _config(root: Path, gc: str) -> None:
    write_config(
        root,
        "enable_test_methods = true\n[cleanup]\nbackoff_initial_s = 0.01\n"
        f'[gc]\nrebuildable = ["node_modules/"]\nidle_after_s = 60\nbudget_interval_s = 3600\n{gc}',
    )


def _root_bytes(daemon: DaemonProcess) -> int:
    usage = daemon.call("workspace.usage", {"refresh": True})
    return int(usage["root"]["total_bytes"])


def _with_a(root: Path, big: Path, *, package: bool = False) -> tuple[dict[str, Any], int]:
    """A root holding one workspace `a` of `big` (with `package`: PACKAGE bytes in its
    node_modules, all its files last changed three days ago): its project and the root's bytes."""
    _config(root, "")
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, big)
        ws = create(daemon, project["id"], "a")["workspace"]
        path = Path(ws["path"])
        if package:
            (path / "node_modules" / "pkg").mkdir(parents=True)
            (path / "node_modules" / "pkg" / "index.js").write_bytes(os.urandom(PACKAGE))
            then = os.stat(path / "README.md").st_mtime - 3 * 86400
            for name in ("README.md", "blob.bin", ".gitignore"):
                os.utime(path / name, (then, then))
        return project, _root_bytes(daemon)
    finally:
        daemon.close()


def _names(daemon: DaemonProcess) -> list[str]:
    return sorted(w["name"] for w in daemon.call("workspace.list")["workspaces"])


def test_a_create_past_max_bytes_is_refused_before_its_intent_row(root: Path, big: Path) -> None:
    project, total = _with_a(root, big)
    _config(root, f"max_bytes = {total + 2 * MB}\n")
    daemon = DaemonProcess(root).start()
    try:
        error = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "b"})
        assert error.kind == "disk_full", error
        assert error.data["max_bytes"] == total + 2 * MB, error.data
        assert error.data["need_bytes"] >= TREE, error.data
        assert error.data["root_bytes"] >= total - MB, error.data
        assert error.data["freed_bytes"] == 0, error.data
        assert "[gc] max_bytes" in str(error) and "gc found nothing" in str(error), str(error)
        assert _names(daemon) == ["a"]
        assert not (root / "workspaces" / "big" / "b").exists()
    finally:
        daemon.close()
    _config(root, f"max_bytes = {total + TREE + 2 * MB}\n")
    daemon = DaemonProcess(root).start()
    try:
        create(daemon, project["id"], "b")  # within it: made
    finally:
        daemon.close()


def test_a_create_past_max_bytes_evicts_first_then_proceeds(root: Path, big: Path) -> None:
    """`a` is idle with PACKAGE bytes of node_modules: the create has gc evict them (and
    reclaim them at once), then proceeds; its result lists the eviction."""
    project, total = _with_a(root, big, package=True)
    assert total >= TREE + PACKAGE
    _config(root, f"max_bytes = {total + MB}\n")
    daemon = DaemonProcess(root).start()
    try:
        result = create(daemon, project["id"], "b")
        keys = [e["key"] for e in result["evicted"]]
        assert keys == [f"evict_rebuildable:{daemon_id(daemon, 'a')}:node_modules"], result
        assert not (root / "workspaces" / "big" / "a" / "node_modules").exists()
        assert _root_bytes(daemon) <= total + MB
    finally:
        daemon.close()


def daemon_id(daemon: DaemonProcess, name: str) -> str:
    [ws] = [w for w in daemon.call("workspace.list")["workspaces"] if w["name"] == name]
    return str(ws["id"])


def test_a_cheap_figure_past_max_bytes_is_measured_before_deciding(
    tmp_short: Path, big: Path
) -> None:
    """gc measured the root; then the filesystem grew by 8 MiB outside it. The cheap figure
    (measured + what the filesystem grew by) says the create would cross `max_bytes`; it is
    not refused on that: gc measures again, finds room, and the create proceeds."""
    with tmpfs(tmp_short / "fs", "size=96m") as fs:
        root = fs / "r"
        project, total = _with_a(root, big)
        _config(root, f"max_bytes = {total + TREE + 2 * MB}\n")
        daemon = DaemonProcess(root).start()
        try:
            daemon.call("gc.plan", {"budget_only": True})  # a measurement, recorded
            junk = fs / "junk.bin"
            with junk.open("wb") as out:
                out.write(os.urandom(8 * MB))
                os.fsync(out.fileno())
            create(daemon, project["id"], "b")
            log = daemon.log_text()
            assert "workspace.create_making_room" in log, log[-3000:]
            assert "gc.made_room" in log, log[-3000:]
        finally:
            daemon.close()


def test_two_creates_that_each_fit_alone_do_not_both_pass_max_bytes(
    tmp_short: Path, root: Path, big: Path
) -> None:
    """The first create passed the check and is held before its intent row (nothing written
    yet): its reservation counts, so the second, which alone would fit, is refused; the first
    then completes."""
    project, total = _with_a(root, big)
    _config(root, f"max_bytes = {total + TREE + 2 * MB}\n")
    holds = tmp_short / "holds"
    daemon = DaemonProcess(root, env=hold_env(HOLD, holds)).start()
    try:
        answers: list[dict[str, Any]] = []
        first = threading.Thread(
            target=lambda: answers.append(
                ask(
                    daemon.socket_path,
                    "workspace.create",
                    {"project_id": project["id"], "name": "b"},
                )
            )
        )
        first.start()
        wait_held(HOLD, holds)
        error = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "c"})
        assert error.kind == "disk_full" and "max_bytes" in str(error), error
        assert "reserved by creates" in str(error), str(error)
        release(HOLD, holds)
        first.join(60)
        assert answers and "result" in answers[0], answers
        assert _names(daemon) == ["a", "b"]
    finally:
        daemon.close()


def test_two_concurrent_creates_at_one_below_max_workspaces_take_one_place(
    tmp_short: Path, root: Path, big: Path
) -> None:
    """Both creates are checked (one place left) and held before their intent rows; released,
    the first takes the place and the second is refused `conflict` in its intent transaction:
    no row of it, nothing made."""
    project, _total = _with_a(root, big)
    _config(root, "max_workspaces = 2\n")
    holds = tmp_short / "holds"
    daemon = DaemonProcess(root, env=hold_env(HOLD, holds)).start()
    try:
        answers: dict[str, dict[str, Any]] = {}

        def make(name: str) -> None:
            params = {"project_id": project["id"], "name": name}
            answers[name] = ask(daemon.socket_path, "workspace.create", params)

        threads = [threading.Thread(target=make, args=(n,)) for n in ("b", "c")]
        for thread in threads:
            thread.start()
        until(
            lambda: daemon.log_text().count(f"fault point {HOLD} held") == 2,
            message="both creates held before their intent rows",
        )

        def released() -> bool:
            release(HOLD, holds)
            return len(answers) == 2

        until(released, message="both creates answered")
        for thread in threads:
            thread.join(60)
        made = [n for n, a in answers.items() if "result" in a]
        refused = [a["error"] for a in answers.values() if "error" in a]
        assert len(made) == 1 and len(refused) == 1, answers
        assert refused[0]["data"]["kind"] == "conflict", refused
        assert refused[0]["data"]["max_workspaces"] == 2, refused
        assert "another create took the last place" in refused[0]["message"], refused
        assert _names(daemon) == sorted(["a", *made])
        loser = "c" if made == ["b"] else "b"
        assert not (root / "workspaces" / "big" / loser).exists()
    finally:
        daemon.close()
