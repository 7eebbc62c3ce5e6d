"""A full filesystem answers `disk_full` (-32017) naming the filesystem and what was not written,
never `internal`; nothing is half-applied; reads keep working; once space is back, writes work
again without a restart. Real tmpfs mounts: the daemon's root (its store) on a small one, or a
project's workspaces directory on one with few blocks or few inodes."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xum_client.errors import XumRpcError

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import rpc_error, worktrees
from tests.support.platform import PORTABLE
from tests.support.tmpfs import fill, tmpfs, use_inodes


def _table(root: Path, table: str) -> list[dict[str, Any]]:
    db = sqlite3.connect(f"file:{root / 'state.db'}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in db.execute(f"SELECT * FROM {table} ORDER BY id")]
    finally:
        db.close()


def _state(root: Path, repo: Path) -> dict[str, Any]:
    """Everything a half-applied write could have changed."""
    return {
        "projects": _table(root, "projects"),
        "workspaces": _table(root, "workspaces"),
        "obligations": _table(root, "cleanup_obligations"),
        "worktrees": worktrees(repo),
        "branches": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
    }


def _assert_disk_full(error: XumRpcError, mount: Path) -> None:
    assert error.kind == "disk_full", error
    assert error.code == -32017, error
    assert error.data["filesystem"] == str(mount), error.data
    assert str(mount) in str(error), str(error)


@pytest.fixture
def full_root(tmp_short: Path) -> Iterator[Path]:
    with tmpfs(tmp_short / "root", "size=4m") as mount:
        yield mount


def test_full_store_refuses_every_write_and_keeps_reads(tmp_short: Path, full_root: Path) -> None:
    repo = make_repo(tmp_short / "repo")
    other = make_repo(tmp_short / "other")
    (repo / ".xum").mkdir()
    (repo / ".xum" / "config.toml").write_text('[scripts]\nsetup = ["true"]\n')
    daemon = DaemonProcess(full_root).start()
    try:
        project = daemon.call("project.add", {"path": str(repo)})["project"]
        ws = daemon.call("workspace.create", {"project_id": project["id"], "name": "a"})[
            "workspace"
        ]
        gone = daemon.call("workspace.create", {"project_id": project["id"], "name": "g"})[
            "workspace"
        ]
        before = _state(full_root, repo)
        filler = fill(full_root)
        writes: list[tuple[str, dict[str, Any]]] = [
            ("project.add", {"path": str(other)}),
            ("project.trust", {"project_id": project["id"]}),
            ("workspace.create", {"project_id": project["id"], "name": "b"}),
            (
                "workspace.create",
                {"project_id": project["id"], "name": "d", "runtime": "directory"},
            ),
            ("workspace.rename", {"workspace_id": ws["id"], "name": "c"}),
            ("workspace.archive", {"workspace_id": ws["id"]}),
            ("workspace.remove", {"workspace_id": gone["id"]}),
            ("project.remove", {"project_id": project["id"]}),
        ]
        for method, params in writes:
            error = rpc_error(daemon, method, params)
            assert error.kind == "disk_full", (method, error)
            _assert_disk_full(error, full_root)
        # Reads keep working, and nothing was half-applied.
        listed = daemon.call("workspace.list", {})["workspaces"]
        assert sorted(w["name"] for w in listed) == ["a", "g"]
        assert daemon.call("daemon.status")["pid"] == daemon.pid
        assert [p["name"] for p in daemon.call("project.list")["projects"]] == ["repo"]
        assert daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]["state"] == (
            "active"
        )
        assert _state(full_root, repo) == before
        assert Path(ws["path"]).is_dir() and Path(gone["path"]).is_dir()
        assert "rpc.internal_error" not in daemon.log_text()
        # Space back: the same writes work, without a restart.
        filler.unlink()
        pid = daemon.pid
        daemon.call("project.add", {"path": str(other)})
        daemon.call("workspace.create", {"project_id": project["id"], "name": "b"})
        daemon.call("workspace.rename", {"workspace_id": ws["id"], "name": "c"})
        daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        assert daemon.pid == pid and daemon.proc is not None and daemon.proc.poll() is None
    finally:
        daemon.close()


def _big_repo(path: Path, mib: int) -> Path:
    repo = make_repo(path, {"README.md": "big\n"})
    for index in range(mib):
        (repo / f"blob{index}.bin").write_bytes(os.urandom(1 << 20))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "big files")
    return repo


def test_checkout_that_fills_the_disk_is_disk_full(tmp_short: Path, daemon: DaemonProcess) -> None:
    # git says only "unable to write file X" here: the error must say the disk is full.
    repo = _big_repo(tmp_short / "repo", 9)
    with tmpfs(tmp_short / "ws", "size=6m") as mount:
        project = daemon.call("project.add", {"path": str(repo), "workspaces_dir": str(mount)})
        branches = git(repo, "for-each-ref", "--format=%(refname)")
        trees = worktrees(repo)
        error = rpc_error(
            daemon, "workspace.create", {"project_id": project["project"]["id"], "name": "w"}
        )
        _assert_disk_full(error, mount)
        assert "unable to write" in str(error)
        assert daemon.call("workspace.list", {})["workspaces"] == []
        assert list(mount.iterdir()) == []
        assert worktrees(repo) == trees
        assert git(repo, "for-each-ref", "--format=%(refname)") == branches


def test_checkout_out_of_inodes_is_disk_full(tmp_short: Path, daemon: DaemonProcess) -> None:
    repo = make_repo(tmp_short / "repo", {f"f{i}.txt": f"{i}\n" for i in range(40)})
    with tmpfs(tmp_short / "ws", "size=64m,nr_inodes=24") as mount:
        project = daemon.call("project.add", {"path": str(repo), "workspaces_dir": str(mount)})
        trees = worktrees(repo)
        error = rpc_error(
            daemon, "workspace.create", {"project_id": project["project"]["id"], "name": "w"}
        )
        _assert_disk_full(error, mount)
        assert daemon.call("workspace.list", {})["workspaces"] == []
        assert worktrees(repo) == trees


def test_directory_create_without_inodes_is_disk_full(
    tmp_short: Path, daemon: DaemonProcess
) -> None:
    # No inode for the workspace's directory: Python's mkdir fails with ENOSPC.
    repo = make_repo(tmp_short / "repo")
    with tmpfs(tmp_short / "ws", "size=4m,nr_inodes=16") as mount:
        project = daemon.call("project.add", {"path": str(repo), "workspaces_dir": str(mount)})
        filled = use_inodes(mount)
        error = rpc_error(
            daemon,
            "workspace.create",
            {"project_id": project["project"]["id"], "name": "d", "runtime": "directory"},
        )
        _assert_disk_full(error, mount)
        assert daemon.call("workspace.list", {})["workspaces"] == []
        assert sorted(mount.iterdir()) == sorted(filled)
        for path in filled[:4]:
            path.unlink()
        made = daemon.call(
            "workspace.create",
            {"project_id": project["project"]["id"], "name": "d", "runtime": "directory"},
        )
        assert Path(made["workspace"]["path"]).is_dir()


def test_store_on_a_full_filesystem_rolls_back_and_recovers(tmp_short: Path) -> None:
    # The store directly: a transaction whose COMMIT cannot be written is `disk_full` naming the
    # filesystem, leaves no transaction open (else every later BEGIN fails until a restart), and
    # changes nothing; reads work meanwhile and writes again once there is space.
    from xumd.base.errors import XumError
    from xumd.store import Store

    with tmpfs(tmp_short / "db", "size=2m") as mount:
        store = Store(mount / "state.db")
        try:
            store.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, blob BLOB)")
            store.execute("INSERT INTO t (blob) VALUES (?)", (b"kept",))
            filler = fill(mount)
            with pytest.raises(XumError) as info, store.transaction():
                for _ in range(64):
                    store.execute("INSERT INTO t (blob) VALUES (?)", (os.urandom(1 << 16),))
            assert info.value.kind == "disk_full"
            assert info.value.data["filesystem"] == str(mount)
            assert str(mount / "state.db") in info.value.message
            assert not store._db.in_transaction
            assert [r[0] for r in store.all("SELECT blob FROM t")] == [b"kept"]
            filler.unlink()
            with store.transaction():
                store.execute("INSERT INTO t (blob) VALUES (?)", (b"after",))
            assert [r[0] for r in store.all("SELECT blob FROM t")] == [b"kept", b"after"]
        finally:
            store.close()


def _fill_all(mount: Path) -> Path:
    """Fill `mount`: no byte and no inode left; return the filler file."""
    filler = fill(mount)
    (mount / "inodes").mkdir()
    use_inodes(mount / "inodes")
    return filler


def _free_all(mount: Path, filler: Path) -> None:
    filler.unlink()
    for path in (mount / "inodes").iterdir():
        path.unlink()
    (mount / "inodes").rmdir()


def test_restart_on_a_full_root_names_the_full_filesystem(tmp_short: Path) -> None:
    # A daemon started on a full root cannot create the store's WAL and shared-memory files
    # (a clean stop removed them): it says the filesystem is full (not that the database is
    # unusable), touches nothing, and starts normally once there is room.
    repo = make_repo(tmp_short / "repo")
    with tmpfs(tmp_short / "root", "size=4m,nr_inodes=400") as mount:
        daemon = DaemonProcess(mount).start()
        try:
            project = daemon.call("project.add", {"path": str(repo)})["project"]
            daemon.call("workspace.create", {"project_id": project["id"], "name": "a"})
            before = _state(mount, repo)
            daemon.terminate()
            assert not (mount / "state.db-wal").exists()
            filler = _fill_all(mount)
            daemon.start(wait_ready=False)
            assert daemon.wait() != 0
            log = daemon.log_text()
            assert f"cannot open the state database {mount / 'state.db'}" in log, log[-2000:]
            assert f"the filesystem mounted at {mount} (tmpfs) is full" in log, log[-2000:]
            assert "not a usable xum state database" not in log
            _free_all(mount, filler)
            daemon.start()
            assert _state(mount, repo) == before
            assert [w["name"] for w in daemon.call("workspace.list", {})["workspaces"]] == ["a"]
        finally:
            daemon.close()


def test_no_inode_for_the_socket_names_the_full_filesystem(tmp_short: Path) -> None:
    # After a crash the store's WAL files are still there (it opens), but binding the socket
    # needs an inode.
    with tmpfs(tmp_short / "root", "size=4m,nr_inodes=400") as mount:
        daemon = DaemonProcess(mount).start()
        try:
            daemon.kill()
            assert (mount / "state.db-wal").exists()
            (mount / "xumd.sock").unlink()
            filler = _fill_all(mount)
            daemon.start(wait_ready=False)
            assert daemon.wait() != 0
            log = daemon.log_text()
            assert f"cannot bind {mount / 'xumd.sock'}" in log, log[-2000:]
            assert f"the filesystem mounted at {mount} (tmpfs) is full" in log, log[-2000:]
            _free_all(mount, filler)
            daemon.start()
            assert daemon.call("daemon.status")["pid"] == daemon.pid
        finally:
            daemon.close()


def test_spawn_without_inodes_for_durable_output_is_disk_full(tmp_short: Path) -> None:
    # keep_processes: an agent's output goes to files under ROOT/processes, here a tmpfs with
    # no inode left (the store, elsewhere, is fine). The spawn is refused disk_full naming it,
    # with no process and no lease left behind.
    root = tmp_short / "root"
    write_config(root, "[processes]\nkeep_processes = true\n")
    repo = make_repo(tmp_short / "repo")
    with tmpfs(root / "processes", "size=4m,nr_inodes=64") as mount:
        daemon = DaemonProcess(root).start()
        try:
            project = daemon.call("project.add", {"path": str(repo)})["project"]
            ws = daemon.call("workspace.create", {"project_id": project["id"], "name": "a"})
            ws_id = ws["workspace"]["id"]
            (mount / "inodes").mkdir()
            filled = use_inodes(mount / "inodes")
            if PORTABLE:
                _no_durable_output(daemon, ws_id)
                return
            error = rpc_error(
                daemon,
                "process.spawn",
                {"workspace_id": ws_id, "kind": "agent", "argv": ["sleep", "60"]},
            )
            _assert_disk_full(error, mount)
            assert daemon.call("process.list", {"workspace_id": ws_id})["processes"] == []
            assert daemon.call("lease.list", {"workspace_id": ws_id})["leases"] == []
            for path in filled[:8]:
                path.unlink()
            spawned = daemon.call(
                "process.spawn", {"workspace_id": ws_id, "kind": "agent", "argv": ["sleep", "60"]}
            )
            daemon.call("process.stop", {"process_id": spawned["process"]["id"]})
        finally:
            daemon.close()


def _no_durable_output(daemon: DaemonProcess, ws_id: str) -> None:
    """The portable backend punches no holes: keep_processes is off and daemon.status says why
    (its `weaker` too), so an agent runs on a pipe to the daemon and the full filesystem under
    ROOT/processes is never written."""
    details = daemon.call("daemon.status")["details"]
    assert details["processes"]["keep_processes"] is False
    assert "cannot punch holes" in details["processes"]["keep_problem"]
    assert any("keep_processes is off" in line for line in details["platform"]["weaker"])
    spawned = daemon.call(
        "process.spawn", {"workspace_id": ws_id, "kind": "agent", "argv": ["sleep", "60"]}
    )["process"]
    assert spawned["on_daemon_stop"] == "stop"
    daemon.call("process.stop", {"process_id": spawned["id"]})


def test_archive_store_full_is_disk_full_and_keeps_the_work(tmp_short: Path) -> None:
    # ROOT/archive on its own small tmpfs (the store is fine): a directory workspace's copy and
    # a worktree's preserved ignored file cannot be written there. Both archives are disk_full
    # naming that filesystem (the copy's error was `internal`); the workspaces stay active with
    # their files in place.
    root = tmp_short / "root"
    (root / "archive").mkdir(parents=True, mode=0o700)
    repo = make_repo(
        tmp_short / "repo",
        {".gitignore": ".env\n", ".xum/config.toml": 'preserve = [".env"]\n'},
    )
    with tmpfs(root / "archive", "size=2m") as mount:
        daemon = DaemonProcess(root).start()
        try:
            project = daemon.call("project.add", {"path": str(repo)})["project"]
            made = [
                daemon.call(
                    "workspace.create",
                    {"project_id": project["id"], "name": "d", "runtime": "directory"},
                )["workspace"],
                daemon.call("workspace.create", {"project_id": project["id"], "name": "w"})[
                    "workspace"
                ],
            ]
            files = [Path(made[0]["path"]) / "big.bin", Path(made[1]["path"]) / ".env"]
            for path in files:
                path.write_bytes(os.urandom(3 << 20))
            digests = [path.read_bytes() for path in files]
            for ws in made:
                error = rpc_error(daemon, "workspace.archive", {"workspace_id": ws["id"]})
                _assert_disk_full(error, mount)
                got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
                assert got["state"] == "active", got
            assert [path.read_bytes() for path in files] == digests
            assert "rpc.internal_error" not in daemon.log_text()
        finally:
            daemon.close()


def test_supervisor_survives_a_full_store(tmp_short: Path, full_root: Path) -> None:
    # A process that exits while the store is full (its lease cannot be removed), and a dead
    # external holder's lease the sweep cannot reclaim: the exit is still reported, and the
    # supervisor keeps running (before: it died, and every later spawn answered
    # shutting_down until a restart).
    import subprocess

    from tests.support.wait import until

    write_config(full_root, "[processes]\nprobe_interval_s = 0.05\n")
    ctl = tmp_short / "ctl"
    ctl.mkdir()
    repo = make_repo(tmp_short / "repo")
    daemon = DaemonProcess(full_root).start()
    holder = subprocess.Popen(["sleep", "600"])
    try:
        project = daemon.call("project.add", {"path": str(repo)})["project"]
        ws = daemon.call("workspace.create", {"project_id": project["id"], "name": "a"})
        ws_id = ws["workspace"]["id"]
        waiter = f"while [ ! -e {ctl}/go ]; do sleep 0.02; done"
        proc = daemon.call(
            "process.spawn", {"workspace_id": ws_id, "kind": "exec", "argv": ["sh", "-c", waiter]}
        )["process"]
        daemon.call("lease.acquire", {"workspace_id": ws_id, "kind": "editor", "pid": holder.pid})
        filler = fill(full_root)
        holder.kill()
        holder.wait()
        (ctl / "go").touch()
        until(
            lambda: (
                daemon.call("process.get", {"process_id": proc["id"]})["process"]["state"]
                == "exited"
            ),
            message="the process to be reported exited",
        )
        until(lambda: "processes.sweep_failed" in daemon.log_text(), message="a failed sweep")
        assert "daemon.background_failed" not in daemon.log_text()
        filler.unlink()
        again = daemon.call(
            "process.spawn", {"workspace_id": ws_id, "kind": "exec", "argv": ["true"]}
        )["process"]
        until(
            lambda: (
                daemon.call("process.get", {"process_id": again["id"]})["process"]["state"]
                == "exited"
            ),
            message="the new process to exit",
        )
        until(
            lambda: daemon.call("lease.list", {"workspace_id": ws_id})["leases"] == [],
            message="the dead holder's lease to be reclaimed",
        )
    finally:
        holder.kill()
        holder.wait()
        daemon.close()


def test_quota_errors_map_to_disk_full(tmp_short: Path) -> None:
    # tmpfs has quotas here, but they do not bind root (CAP_SYS_RESOURCE), as the daemon runs
    # in these tests: the mapping itself, with the errors as
    # the kernel raises them (EDQUOT from a write).
    import errno

    from xumd.system import diskfull

    target = tmp_short / "out" / "file"
    quota = diskfull.from_exception(OSError(errno.EDQUOT, "Disk quota exceeded", str(target)))
    assert quota is not None and quota.kind == "disk_full"
    assert quota.data["path"] == str(target) and quota.data["filesystem"]
    assert diskfull.from_exception(OSError(errno.EACCES, "Permission denied")) is None


def test_unarchive_and_directory_create_on_a_full_filesystem(tmp_short: Path) -> None:
    # The workspaces directory fills up while workspaces are archived: unarchive is disk_full
    # naming it (git's checkout; the directory runtime's marker, whose write had no file name
    # and whose empty directory stayed at the path, so every later unarchive said "exists").
    from tests.reliability.lifecycle_support import wait_cleanup_idle

    repo = make_repo(tmp_short / "repo", {f"f{i}.txt": f"{i}\n" for i in range(30)})
    root = tmp_short / "root"
    with tmpfs(tmp_short / "ws", "size=4m") as mount:
        daemon = DaemonProcess(root).start()
        try:
            project = daemon.call("project.add", {"path": str(repo), "workspaces_dir": str(mount)})[
                "project"
            ]
            made = []
            for runtime in ("worktree", "directory"):
                ws = daemon.call(
                    "workspace.create",
                    {"project_id": project["id"], "name": runtime[0], "runtime": runtime},
                )["workspace"]
                (Path(ws["path"]) / "work.txt").write_text(f"{runtime}\n")
                daemon.call("workspace.archive", {"workspace_id": ws["id"]})
                made.append(ws)
            wait_cleanup_idle(root)
            filler = fill(mount)
            for ws in made:
                error = rpc_error(daemon, "workspace.unarchive", {"workspace_id": ws["id"]})
                _assert_disk_full(error, mount)
                got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
                assert got["state"] == "archived", got
                assert not os.path.lexists(ws["path"]), ws["path"]
            error = rpc_error(
                daemon,
                "workspace.create",
                {"project_id": project["id"], "name": "n", "runtime": "directory"},
            )
            _assert_disk_full(error, mount)
            assert not os.path.lexists(mount / "n")
            filler.unlink()
            for ws, runtime in zip(made, ("worktree", "directory"), strict=True):
                daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
                assert (Path(ws["path"]) / "work.txt").read_text() == f"{runtime}\n"
        finally:
            daemon.close()


def test_read_only_workspaces_dir_is_operation_failed_not_internal(
    tmp_short: Path, daemon: DaemonProcess
) -> None:
    # Not a full disk but the same family (the machine refuses the write): a read-only bind
    # mount of the workspaces directory. git says so itself; the directory runtime's mkdir
    # was an `internal` error.
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    repo = make_repo(tmp_short / "repo")
    wsdir = tmp_short / "ro"
    wsdir.mkdir()
    done = subprocess.run(["mount", "--bind", str(wsdir), str(wsdir)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {done.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(wsdir)], check=True)
        project = daemon.call("project.add", {"path": str(repo), "workspaces_dir": str(wsdir)})
        for runtime in ("directory", "worktree"):
            error = rpc_error(
                daemon,
                "workspace.create",
                {"project_id": project["project"]["id"], "name": "w", "runtime": runtime},
            )
            assert error.kind == "operation_failed", error
            assert "Read-only file system" in str(error), error
        assert daemon.call("workspace.list", {})["workspaces"] == []
        assert "rpc.internal_error" not in daemon.log_text()
    finally:
        subprocess.run(["umount", "-l", str(wsdir)], capture_output=True, check=False)


def test_create_whose_setup_fills_the_disk_is_undone(tmp_short: Path, full_root: Path) -> None:
    # The store and the checkout share the root's filesystem (the default layout). A trusted
    # setup fills it from inside the checkout, so the create's completion commit cannot be
    # written: disk_full, and the undo (discard the checkout, which frees the space, then
    # delete the intent row) leaves nothing behind.
    repo = make_repo(
        tmp_short / "repo",
        {".xum/config.toml": '[scripts]\nsetup = ["head -c 16M /dev/zero > fill || true"]\n'},
    )
    daemon = DaemonProcess(full_root).start()
    try:
        project = daemon.call("project.add", {"path": str(repo)})["project"]
        daemon.call("project.trust", {"project_id": project["id"]})
        before = _state(full_root, repo)
        error = rpc_error(daemon, "workspace.create", {"project_id": project["id"], "name": "w"})
        _assert_disk_full(error, full_root)
        assert _state(full_root, repo) == before
        assert not (full_root / "workspaces" / "repo" / "w").exists()
        # Writes work again once the setup no longer fills the disk.
        (repo / ".xum" / "config.toml").write_text('[scripts]\nsetup = ["true"]\n')
        git(repo, "commit", "-qam", "setup that fits")
        daemon.call("project.trust", {"project_id": project["id"]})
        made = daemon.call("workspace.create", {"project_id": project["id"], "name": "v"})
        assert made["workspace"]["state"] == "active"
    finally:
        daemon.close()
