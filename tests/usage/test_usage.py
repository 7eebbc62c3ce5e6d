"""Disk usage (`workspace.usage`, `xum du`, `xum ws ls --usage`): real files, a sparse file, hard
links, a mount inside a checkout, a real daemon."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from xumd.usage import walk

from tests.cli.test_workspace import xum, xum_json
from tests.support.daemon import DaemonProcess, short_tmpdir
from tests.support.gitrepo import make_repo
from tests.support.holds import hold_env, release, wait_held
from tests.support.lifecycle_helpers import add_project, create, rpc_error
from tests.support.otheruser import as_nobody
from tests.support.tmpfs import tmpfs

MIB = 1 << 20
RECLAIM_HOLD = "cleanup.reclaim.hold"


def _allocated(path: Path) -> int:
    return os.lstat(path).st_blocks * 512


def test_walk_counts_allocated_bytes_and_hard_links_once(tmp_short: Path) -> None:
    top = tmp_short / "t"
    (top / "big").mkdir(parents=True)
    sparse = top / "big" / "sparse.img"
    with sparse.open("wb") as out:
        out.truncate(64 * MIB)  # a hole: 64 MiB long, (almost) nothing allocated
        out.write(b"x" * 4096)
    data = top / "data.bin"
    data.write_bytes(os.urandom(MIB))
    os.link(data, top / "big" / "data-link.bin")
    (top / "link-to-data").symlink_to("data.bin")
    figures = walk.walk(str(top), time.monotonic() + 30)
    assert figures.complete
    assert figures.files == 3  # sparse, data (its hard link is the same file), the symlink
    assert figures.apparent_bytes == 64 * MIB + MIB + len("data.bin")
    expected = sum(_allocated(p) for p in (top, top / "big", sparse, data, top / "link-to-data"))
    assert figures.bytes == expected  # the hard link's blocks once, the hole not at all
    assert figures.bytes < 8 * MIB
    by_top = {d.path: d.bytes for d in figures.largest}
    assert by_top["data.bin"] == _allocated(data)
    # The hard link under big/ was already counted with data.bin: big/ holds the sparse file.
    assert by_top["big"] == _allocated(top / "big") + _allocated(sparse)


def test_walk_ignored_share_and_deadline(tmp_short: Path) -> None:
    top = tmp_short / "t"
    (top / "node_modules" / "pkg").mkdir(parents=True)
    (top / "node_modules" / "pkg" / "index.js").write_bytes(b"y" * 10000)
    (top / "app.log").write_bytes(b"z" * 5000)
    (top / "src.py").write_bytes(b"print()\n")
    figures = walk.walk(str(top), time.monotonic() + 30, frozenset({"node_modules", "app.log"}))
    assert figures.ignored_files == 2
    assert figures.ignored_bytes == (
        _allocated(top / "node_modules")
        + _allocated(top / "node_modules" / "pkg")
        + _allocated(top / "node_modules" / "pkg" / "index.js")
        + _allocated(top / "app.log")
    )
    late = walk.walk(str(top), time.monotonic() - 1)
    assert not late.complete
    assert "deadline" in (late.error or "")


def test_walk_stops_at_a_mount(tmp_short: Path) -> None:
    top = tmp_short / "t"
    top.mkdir()
    (top / "own").write_bytes(b"a" * 8192)
    with tmpfs(top / "mnt", "size=8m") as mnt:
        (mnt / "foreign").write_bytes(os.urandom(2 * MIB))
        figures = walk.walk(str(top), time.monotonic() + 30)
    assert figures.files == 1
    assert figures.bytes < MIB
    assert figures.mounts_skipped == [str(top / "mnt")]


@pytest.fixture
def repo(tmp_short: Path) -> Path:
    return make_repo(tmp_short / "repo", {"README.md": "hi\n", ".gitignore": "build/\n*.log\n"})


def test_workspace_usage_end_to_end(
    daemon: DaemonProcess, project: dict[str, Any], tmp_short: Path
) -> None:
    ws = create(daemon, project["id"], "u1")["workspace"]
    path = Path(ws["path"])
    (path / "build").mkdir()
    (path / "build" / "out.bin").write_bytes(os.urandom(3 * MIB))
    (path / "x.log").write_bytes(b"l" * 4096)
    (path / "notes.txt").write_bytes(b"n" * 100)
    one = daemon.call("workspace.usage", {"workspace_id": ws["id"]})
    [entry] = one["workspaces"]
    figures = entry["usage"]
    assert figures["complete"]
    assert figures["ignored_files"] == 2
    assert figures["ignored_bytes"] >= 3 * MIB
    assert figures["bytes"] > figures["ignored_bytes"]
    assert figures["largest"][0]["path"] == "build"
    assert one["root"] is None
    # Cached: a second call answers the same walk, older.
    (path / "build" / "more.bin").write_bytes(os.urandom(MIB))
    again = daemon.call("workspace.usage", {"workspace_id": ws["id"]})["workspaces"][0]
    assert again["computed_at"] == entry["computed_at"]
    assert again["usage"]["bytes"] == figures["bytes"]
    fresh = daemon.call("workspace.usage", {"workspace_id": ws["id"], "refresh": True})
    assert fresh["workspaces"][0]["usage"]["bytes"] >= figures["bytes"] + MIB
    # All: root totals with the trash and the archive store.
    everything = daemon.call("workspace.usage", {})
    root = everything["root"]
    assert root["workspaces_bytes"] == sum(
        w["usage"]["bytes"] for w in everything["workspaces"] if w["usage"]
    )
    assert root["total_bytes"] >= root["workspaces_bytes"]
    assert rpc_error(daemon, "workspace.usage", {"workspace_id": "prj_0123456789abcdef"}).kind == (
        "invalid_scope"
    )


def test_usage_of_archived_workspace_has_no_checkout(
    daemon: DaemonProcess, project: dict[str, Any]
) -> None:
    ws = create(daemon, project["id"], "gone")["workspace"]
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    [entry] = daemon.call("workspace.usage", {"workspace_id": ws["id"]})["workspaces"]
    assert entry["state"] == "archived"
    assert entry["usage"] is None


def test_cli_du_and_ls_usage(daemon: DaemonProcess, project: dict[str, Any]) -> None:
    ws = create(daemon, project["id"], "c1")["workspace"]
    (Path(ws["path"]) / "build").mkdir()
    (Path(ws["path"]) / "build" / "b").write_bytes(os.urandom(2 * MIB))
    du = xum(daemon, "du").stdout
    assert "c1" in du
    assert "2.0 MiB ignored" in du
    assert "largest: build 2.0 MiB" in du
    assert "trash:" in du and "archive store:" in du and "total:" in du
    ls = xum(daemon, "ws", "ls", "--usage").stdout
    [line] = [x for x in ls.splitlines() if "c1" in x]
    assert "MiB" in line
    as_json = xum_json(daemon, "ws", "ls", "--usage")
    assert as_json["usage"][0]["workspace_id"] == ws["id"]


def test_root_totals_count_a_pending_reclaim(root: Path, tmp_short: Path) -> None:
    """A checkout moved into the trash whose reclaim has not run yet (held at its start): the
    root totals name it, with its bytes, in the trash and as a pending reclaim."""
    repo = make_repo(tmp_short / "repo2", {"README.md": "hi\n"})
    holds = tmp_short / "holds"
    holds.mkdir()
    daemon = DaemonProcess(root, env=hold_env(RECLAIM_HOLD, holds)).start()
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "big")["workspace"]
        (Path(ws["path"]) / "blob.bin").write_bytes(os.urandom(3 * MIB))
        git_commit_all(Path(ws["path"]))
        before = daemon.call("workspace.usage", {})["root"]
        assert before["pending_reclaims"] == 0
        daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        wait_held(RECLAIM_HOLD, holds)
        root_usage = daemon.call("workspace.usage", {})["root"]
        assert root_usage["pending_reclaims"] == 1
        assert root_usage["pending_reclaim_bytes"] >= 3 * MIB
        assert root_usage["trash"]["bytes"] >= 3 * MIB
        assert root_usage["total_bytes"] >= root_usage["trash"]["bytes"]
        # The pending reclaim lies in the trash: counted there, never a second time.
        assert root_usage["total_bytes"] == (
            root_usage["workspaces_bytes"]
            + root_usage["trash"]["bytes"]
            + root_usage["archive_store"]["bytes"]
        )
        release(RECLAIM_HOLD, holds)
    finally:
        daemon.close()


def git_commit_all(path: Path) -> None:
    from tests.support.gitrepo import git

    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "blob")


def test_checkout_swapped_for_a_symlink_is_not_followed(
    daemon: DaemonProcess, project: dict[str, Any], tmp_short: Path
) -> None:
    """Someone replaced the checkout with a symlink to a big tree: usage does not walk it."""
    ws = create(daemon, project["id"], "swapped")["workspace"]
    path = Path(ws["path"])
    elsewhere = tmp_short / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "big.bin").write_bytes(os.urandom(2 * MIB))
    path.rename(tmp_short / "moved-away")
    path.symlink_to(elsewhere)
    [entry] = daemon.call("workspace.usage", {"workspace_id": ws["id"]})["workspaces"]
    assert entry["usage"] is None


def test_walk_of_a_directory_it_cannot_read_is_a_lower_bound() -> None:
    """As another user (root reads a mode-000 directory): what can be read is counted, and the
    figures say they are a lower bound, naming the directory that could not be read."""
    top = short_tmpdir()  # (pytest's tmp_path is 0700: `nobody` could not enter it)
    top.chmod(0o755)
    (top / "closed").mkdir()
    (top / "closed" / "hidden").write_bytes(b"x" * 8192)
    (top / "open").mkdir()
    (top / "open" / "seen").write_bytes(b"x" * 8192)
    os.chmod(top / "closed", 0)
    try:

        def figures() -> tuple[int, bool, str | None]:
            found = walk.walk(str(top), time.monotonic() + 30)
            return found.files, found.complete, found.error

        files, complete, error = as_nobody(figures)
    finally:
        os.chmod(top / "closed", 0o755)
        shutil.rmtree(top)
    assert files == 1  # open/seen
    assert not complete
    assert error == "closed: Permission denied"


def test_walk_of_a_symlinked_top_walks_nothing(tmp_short: Path) -> None:
    target = tmp_short / "target"
    target.mkdir()
    (target / "f").write_bytes(b"x" * 8192)
    (tmp_short / "link").symlink_to(target)
    figures = walk.walk(str(tmp_short / "link"), time.monotonic() + 30)
    assert figures.files == 0 and figures.bytes == 0
    assert not figures.complete


def test_cache_ages_by_the_monotonic_clock(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cached answer's freshness and age come from the monotonic clock: the wall clock
    stepped back (NTP, a suspended laptop's correction) must not keep an old walk fresh."""
    import types

    import anyio
    from xumd.base.config import UsageConfig
    from xumd.lifecycle.rows import WorkspaceRow
    from xumd.usage import service

    checkout = tmp_short / "ws"
    checkout.mkdir()
    (checkout / "a.txt").write_text("a\n")
    app: Any = types.SimpleNamespace(config=types.SimpleNamespace(usage=UsageConfig(cache_s=0)))
    usage = service.UsageService(app, git=Any, reclaims=Any, pool=Any)  # type: ignore[arg-type]
    row = WorkspaceRow(
        **{f: None for f in WorkspaceRow.__dataclass_fields__}  # type: ignore[arg-type]
        | {"id": "ws_1", "project_id": "p_1", "name": "w", "state": "active"}
        | {"runtime": "directory", "path": checkout, "incarnation": "i1"}
    )
    wall = [time.time()]
    monkeypatch.setattr(
        service, "time", types.SimpleNamespace(time=lambda: wall[0], monotonic=time.monotonic)
    )

    async def twice() -> tuple[Any, Any]:
        first = await usage.figures(row)
        (checkout / "b.txt").write_text("b\n")
        wall[0] -= 3600.0  # the wall clock steps back an hour
        return first, await usage.figures(row)

    first, second = anyio.run(twice)
    assert first.files == 1
    assert second.files == 2  # cache_s = 0: walked again, whatever the wall clock says


def test_one_huge_checkout_does_not_starve_the_others(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`workspace.usage` of every workspace shares one deadline: a checkout whose walk takes the
    whole of it (it comes back partial, so it is walked again next time) must not leave every
    other workspace unmeasured, call after call."""
    import types

    import anyio
    from xumd.base.config import UsageConfig
    from xumd.lifecycle.rows import WorkspaceRow
    from xumd.usage import service

    def row(name: str) -> WorkspaceRow:
        path = tmp_short / name
        path.mkdir()
        (path / "f.txt").write_text(name)
        fields: dict[str, Any] = dict.fromkeys(WorkspaceRow.__dataclass_fields__)
        fields |= {"id": f"ws_{name}", "project_id": "p_1", "name": name, "state": "active"}
        fields |= {"runtime": "directory", "path": path, "incarnation": "i1"}
        return WorkspaceRow(**fields)

    found = [row("huge"), row("small1"), row("small2")]
    real_walk = walk.walk
    smalls_done = threading.Event()
    finished: list[str] = []
    lock = threading.Lock()

    def slow_walk(top: str, deadline: float, ignored: frozenset[str] = frozenset()) -> Any:
        if top.endswith("huge"):
            # Holds its lane until both small walks are done, or the whole deadline when they
            # cannot run beside it; then it is out of time: a partial walk.
            smalls_done.wait(timeout=max(0.0, deadline - time.monotonic()))
            return real_walk(top, time.monotonic(), ignored)
        figures = real_walk(top, deadline, ignored)
        with lock:
            finished.append(top)
            if len(finished) == 2:
                smalls_done.set()
        return figures

    monkeypatch.setattr(service.walk, "walk", slow_walk)
    config = types.SimpleNamespace(usage=UsageConfig(deadline_s=1.0))
    app: Any = types.SimpleNamespace(config=config, store=None)
    usage = service.UsageService(app, git=Any, reclaims=Any, pool=Any)  # type: ignore[arg-type]

    async def everything() -> Any:
        return await usage._all(found, time.monotonic() + 1.0, refresh=False)

    listed = {w.name: w.usage for w in anyio.run(everything)}
    assert not listed["huge"].complete
    assert listed["small1"].complete and listed["small1"].files == 1
    assert listed["small2"].complete and listed["small2"].files == 1
