"""The warm pool's refill against the disk budget, on a real tmpfs small enough to fill: an entry
is dropped (gc's run, the pool's surplus) while the budget lacks room, and the refill does not
write it back (logged once for the episode however often it is woken, shown in `daemon.status`'s
budget line); once the space is back, the refill makes the entry again and says so."""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from xum_protocol.models.daemon import GcStatus

from tests.gc.test_budget import _free
from tests.lifecycle.test_pool import entries, ready
from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project
from tests.support.tmpfs import tmpfs
from tests.support.wait import until

MB = 1 << 20
POOLED = ".xum/config.toml"


@pytest.fixture
def fs(tmp_short: Path) -> Iterator[Path]:
    with tmpfs(tmp_short / "fs", "size=96m") as mount:
        yield mount


def _pooled_repo(path: Path, files: dict[str, str]) -> Path:
    return make_repo(path, {**files, POOLED: "[create]\npool = 1\n"})


def _refilled(daemon: DaemonProcess, project_id: str) -> bool:
    return any(
        "pool.refilled" in line and project_id in line for line in daemon.log_text().splitlines()
    )


def test_a_dropped_entry_is_not_written_back_while_the_budget_lacks_room(
    fs: Path, tmp_short: Path
) -> None:
    repo = _pooled_repo(tmp_short / "big", {"README.md": "hi\n", "blob.bin": "x" * (4 * MB)})
    root = fs / "r"
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        [entry] = ready(root)
    finally:
        daemon.close()
    junk = fs / "junk.bin"
    junk.write_bytes(os.urandom(8 * MB))
    # The budget lacks 1 MiB with the entry there: dropping it (4 MiB) restores it, writing it
    # again would not.
    write_config(root, f"[gc]\nmin_free_bytes = {_free(fs) + MB}\nbudget_interval_s = 3600\n")
    daemon = DaemonProcess(root).start()
    try:
        # The entry made surplus: gc drops it (or the refill's own start-up pass, when it read
        # the size first; both drop through the pool's one drop).
        (repo / POOLED).write_text("[create]\npool = 0\n")
        done = [d["key"] for d in daemon.call("gc.run")["done"]]
        assert done in ([f"drop_pool_entry:{entry['id']}"], []), done
        until(lambda: entries(root) == [], message="the entry dropped")
        assert "pool.entry_dropped" in daemon.log_text()
        (repo / POOLED).write_text("[create]\npool = 1\n")
        add_project(daemon, make_repo(tmp_short / "p2", {"a.txt": "a\n"}))  # wakes the refill
        until(lambda: "pool.refill_held_back" in daemon.log_text(), message="the refill held")
        # Woken again and again (each project added wakes it; each of these has a pool of its
        # own, made: proof the passes ran): still held, and said once.
        for name in ("p3", "p4"):
            other = add_project(daemon, _pooled_repo(tmp_short / name, {"a.txt": "a\n"}))
            until(partial(_refilled, daemon, other["id"]), message=f"{name}'s entry made")
        assert daemon.log_text().count("pool.refill_held_back") == 1
        assert [e for e in entries(root) if e["project_id"] == project["id"]] == []
        status = GcStatus.model_validate(daemon.call("daemon.status")["details"]["gc"]).budget
        assert "the warm pool's refill is held back" in status and project["id"] in status
        # The space back: the next pass makes the entry, and says the episode ended.
        junk.unlink()
        add_project(daemon, make_repo(tmp_short / "p5", {"a.txt": "a\n"}))
        until(
            lambda: [e for e in entries(root, "ready") if e["project_id"] == project["id"]],
            message="the entry made again",
        )
        assert "pool.refill_resumed" in daemon.log_text()
        status = GcStatus.model_validate(daemon.call("daemon.status")["details"]["gc"]).budget
        assert "held back" not in status, status
    finally:
        daemon.close()


def test_a_refill_that_would_cross_max_bytes_is_held_back(tmp_short: Path) -> None:
    """`max_bytes` below one entry: the refill has gc measure the root (no figure yet), makes no
    entry, and says why once."""
    repo = _pooled_repo(tmp_short / "big", {"README.md": "hi\n", "blob.bin": "x" * (4 * MB)})
    root = tmp_short / "root"
    write_config(root, f"[gc]\nmax_bytes = {MB}\nbudget_interval_s = 3600\n")
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        until(lambda: "pool.refill_held_back" in daemon.log_text(), message="the refill held")
        [line] = [x for x in daemon.log_text().splitlines() if "pool.refill_held_back" in x]
        assert "max_bytes" in line and project["id"] in line, line
        assert entries(root) == []
        assert not any((root / "workspaces").rglob("blob.bin"))
    finally:
        daemon.close()
