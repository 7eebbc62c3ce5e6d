"""The disk budget on a real block filesystem: an ext4 image of 256 MB on a loop device (skipped,
saying why, where the test is not root or no loop device can be set up). Workspaces whose
`node_modules/` hold real files; a budget that lacks ~1.5 of them. A create on it makes room
before it writes (the least recently used workspaces' node_modules evicted and reclaimed, the
space back on the device), and a create that would still overflow (the rest busy) is refused
before anything is made."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gc.test_budget import PACKAGE, _free, _start, budget_repo
from tests.support.lifecycle_helpers import create, rpc_error
from tests.support.tmpfs import loop_filesystem

MB = 1 << 20
IMAGE_BYTES = 256 * MB


@pytest.fixture
def ext4(tmp_short: Path) -> Iterator[Path]:
    # -m 0: no blocks reserved for root (the daemon runs as root here: it would see them free)
    with loop_filesystem(tmp_short, "ext4", IMAGE_BYTES, ["-q", "-F", "-m", "0"]) as mount:
        yield mount


@pytest.fixture
def repo(tmp_short: Path) -> Path:
    return budget_repo(tmp_short / "repo")


def test_a_create_on_a_full_ext4_image_makes_room_or_refuses(ext4: Path, repo: Path) -> None:
    root = ext4 / "r"
    daemon, made = _start(root, ext4, repo)
    try:
        project_id = made["a"]["project_id"]
        before = _free(ext4)
        result = create(daemon, project_id, "d")
        assert [e["key"] for e in result["evicted"]] == [
            f"evict_rebuildable:{made['a']['id']}:node_modules",
            f"evict_rebuildable:{made['b']['id']}:node_modules",
        ], result["evicted"]
        # The blocks are back on the device before the create wrote its checkout.
        assert _free(ext4) >= before + 2 * PACKAGE - 2 * MB, (before, _free(ext4))
        assert (Path(made["c"]["path"]) / "node_modules" / "pkg" / "index.js").exists()
        for name in ("a", "b"):
            assert (Path(made[name]["path"]) / "README.md").read_text() == "hi\n"
        assert not any((root / "trash").iterdir()) if (root / "trash").is_dir() else True

        # Fill the device to just above the budget's floor: the next create would cross it,
        # and what is left (c, d) is busy.
        floor = daemon.call("gc.plan", {"budget_only": True})["budget"][0]["limit_bytes"]
        filler = ext4 / "filler"
        filler.write_bytes(b"\0" * max(0, _free(ext4) - floor - 4096))
        sleeper = subprocess.Popen(["sleep", "300"])
        try:
            for ws in (made["c"], result["workspace"]):
                daemon.call(
                    "lease.acquire",
                    {"workspace_id": ws["id"], "kind": "editor", "pid": sleeper.pid},
                )
            error = rpc_error(daemon, "workspace.create", {"project_id": project_id, "name": "e"})
            assert error.kind == "disk_full", error
            assert error.data["filesystem"] == str(ext4), error.data
            assert "busy" in str(error), str(error)
            names = [w["name"] for w in daemon.call("workspace.list")["workspaces"]]
            assert sorted(names) == ["a", "b", "c", "d"]
            assert (Path(made["c"]["path"]) / "node_modules" / "pkg" / "index.js").exists()
        finally:
            sleeper.send_signal(signal.SIGKILL)
            sleeper.wait()
    finally:
        daemon.close()
