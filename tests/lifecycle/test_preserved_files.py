"""Files the user asked to keep (docs/RELIABILITY.md): a preserved ignored file
is never overwritten by setup nor dropped without a copy the user can find, and its saved copy
goes only once the restored bytes are verified in place and the workspace is active."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xum_client.errors import XumClientError
from xumd.lifecycle.snapshot import Snapshotter
from xumd.system.git import Git

from tests.crash.world import World
from tests.support.daemon import DaemonProcess, write_config
from tests.support.fsattr import immutable
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import (
    add_project,
    create,
    failing_teardown,
    rpc_error,
    trusted_daemon,
)
from tests.support.tmpfs import tmpfs

SECRET = "API_KEY=the-users-secret\n"
EXAMPLE = "API_KEY=example\n"


def env_repo(path: Path, *, setup: list[str] | None = None) -> Path:
    """The configuration docs/CONFIGURATION.md shows: setup copies the example over `.env`,
    `.env*` is preserved, `.env` is ignored."""
    scripts = {"preserve": [".env*"]}
    if setup is not None:
        scripts["setup"] = setup
    lines = "".join(f"{key} = {json.dumps(value)}\n" for key, value in scripts.items())
    return make_repo(
        path,
        {
            "README.md": "hello\n",
            ".gitignore": ".env\n.env.local\nnode_modules/\n",
            ".env.example": EXAMPLE,
            ".xum/config.toml": f"[scripts]\n{lines}",
        },
    )


@pytest.fixture
def env_daemon(tmp_short: Path) -> Iterator[tuple[DaemonProcess, dict[str, Any], Path]]:
    repo = env_repo(tmp_short / "repo", setup=["cp .env.example .env"])
    root = tmp_short / "root"
    write_config(root, "[cleanup]\nbackoff_initial_s = 0.01\n")
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        daemon.call("project.trust", {"project_id": project["id"]})
        yield daemon, project, repo
    finally:
        daemon.close()


def test_setup_never_overwrites_a_restored_preserved_file(
    env_daemon: tuple[DaemonProcess, dict[str, Any], Path],
) -> None:
    """The reported case: archive saves `.env`; unarchive's setup (`cp .env.example .env`) would
    overwrite it. The user's copy wins, the result says so, and the saved copy goes only after
    it is verified in place."""
    daemon, project, _repo = env_daemon
    ws = create(daemon, project["id"], "a")
    assert ws["setup"]["status"] == "ok"
    path = Path(ws["workspace"]["path"])
    assert (path / ".env").read_text() == EXAMPLE  # setup made it
    (path / ".env").write_text(SECRET)
    (path / ".env.local").write_text("LOCAL=1\n")
    wid = ws["workspace"]["id"]
    archived = daemon.call("workspace.archive", {"workspace_id": wid})
    assert sorted(archived["dropped"]["preserved"]) == [".env", ".env.local"]
    saved = daemon.root / "archive" / wid
    assert (saved / "files" / ".env").read_text() == SECRET
    back = daemon.call("workspace.unarchive", {"workspace_id": wid})
    assert back["setup"]["status"] == "ok"
    assert (path / ".env").read_text() == SECRET
    assert (path / ".env.local").read_text() == "LOCAL=1\n"
    restored = back["restored"]
    assert sorted(restored["preserved"]) == [".env", ".env.local"]
    assert restored["replaced"] == [".env"]
    assert restored["kept_at"] is None and restored["unverified"] == []
    assert not saved.exists(), "the saved copy goes once verified in place and active"
    assert daemon.call("workspace.strays", {})["strays"] == []


def test_directory_runtime_setup_never_overwrites_restored_files(tmp_short: Path) -> None:
    plain = tmp_short / "plain"
    plain.mkdir()
    (plain / ".xum").mkdir()
    (plain / ".xum" / "config.toml").write_text(
        '[scripts]\nsetup = ["echo generated > .env; rm -f notes.txt"]\npreserve = [".env*"]\n'
    )
    daemon = DaemonProcess(tmp_short / "root").start()
    try:
        project = add_project(daemon, plain)
        daemon.call("project.trust", {"project_id": project["id"]})
        ws = create(daemon, project["id"], "d", runtime="directory")["workspace"]
        path = Path(ws["path"])
        assert (path / ".env").read_text() == "generated\n"
        (path / ".env").write_text(SECRET)
        (path / "notes.txt").write_text("mine\n")
        daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
        assert (path / ".env").read_text() == SECRET
        assert (path / "notes.txt").read_text() == "mine\n"
        # Setup rewrote `.env` and removed `notes.txt`: both are the user's again.
        assert back["restored"]["replaced"] == [".env", "notes.txt"]
        assert not (daemon.root / "archive" / ws["id"]).exists()
    finally:
        daemon.close()


def test_rename_of_an_active_workspace_moves_its_ignored_files(
    env_daemon: tuple[DaemonProcess, dict[str, Any], Path],
) -> None:
    """`git worktree move` takes the whole directory: preserved and other ignored files move
    with it, byte for byte."""
    daemon, project, _repo = env_daemon
    ws = create(daemon, project["id"], "a")["workspace"]
    old = Path(ws["path"])
    (old / ".env").write_text(SECRET)
    (old / "node_modules").mkdir()
    (old / "node_modules" / "dep.js").write_text("dep\n")
    renamed = daemon.call("workspace.rename", {"workspace_id": ws["id"], "name": "b"})
    new = Path(renamed["workspace"]["path"])
    assert not old.exists()
    assert (new / ".env").read_text() == SECRET
    assert (new / "node_modules" / "dep.js").read_text() == "dep\n"


def test_rename_while_archived_keeps_the_preserved_copy(
    env_daemon: tuple[DaemonProcess, dict[str, Any], Path],
) -> None:
    """The saved copy is keyed by the workspace's id, not its name: a rename of the archived
    workspace restores the same files at the new path."""
    daemon, project, _repo = env_daemon
    ws = create(daemon, project["id"], "a")["workspace"]
    (Path(ws["path"]) / ".env").write_text(SECRET)
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    renamed = daemon.call("workspace.rename", {"workspace_id": ws["id"], "name": "b"})
    back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    new_path = Path(renamed["workspace"]["path"])
    assert back["workspace"]["path"] == str(new_path)
    assert (new_path / ".env").read_text() == SECRET
    assert back["restored"]["replaced"] == [".env"]


def test_remove_without_force_refuses_naming_the_preserved_files(
    env_daemon: tuple[DaemonProcess, dict[str, Any], Path],
) -> None:
    daemon, project, _repo = env_daemon
    ws = create(daemon, project["id"], "a")["workspace"]
    path = Path(ws["path"])
    (path / ".env").write_text(SECRET)
    (path / "node_modules").mkdir()
    (path / "node_modules" / "dep.js").write_text("x\n")  # ignored, not preserved: dropped
    err = rpc_error(daemon, "workspace.remove", {"workspace_id": ws["id"]})
    assert err.kind == "not_safe"
    assert err.data["preserved"] == [".env"]
    assert ".env" in err.message and "force" in err.message
    assert (path / ".env").read_text() == SECRET
    assert daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]["state"] == (
        "active"
    )


def test_remove_with_force_keeps_preserved_files_listed_and_discardable(
    env_daemon: tuple[DaemonProcess, dict[str, Any], Path],
) -> None:
    daemon, project, _repo = env_daemon
    ws = create(daemon, project["id"], "a")["workspace"]
    path = Path(ws["path"])
    (path / ".env").write_text(SECRET)
    removed = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
    kept = removed["kept"]
    assert kept is not None and kept["files"] == [".env"]
    kept_dir = Path(kept["path"])
    assert kept_dir == daemon.root / "archive" / ws["id"]
    assert (kept_dir / "files" / ".env").read_text() == SECRET
    (stray,) = daemon.call("workspace.strays", {})["strays"]
    assert stray["kind"] == "kept" and stray["path"] == str(kept_dir)
    assert stray["kept_files"] == [".env"] and stray["workspace_id"] == ws["id"]
    assert stray["project_id"] == project["id"]
    assert "removed workspace" in stray["note"]
    # Filtered by project too.
    by_project = daemon.call("workspace.strays", {"project_id": project["id"]})["strays"]
    assert [s["path"] for s in by_project] == [str(kept_dir)]
    done = daemon.call("workspace.discard_kept", {"path": str(kept_dir)})
    assert done == {"path": str(kept_dir), "files": 1}
    assert not kept_dir.exists()
    assert daemon.call("workspace.strays", {})["strays"] == []


def test_remove_of_an_archived_workspace_keeps_its_saved_copy_and_says_where(
    env_daemon: tuple[DaemonProcess, dict[str, Any], Path],
) -> None:
    daemon, project, _repo = env_daemon
    ws = create(daemon, project["id"], "a")["workspace"]
    (Path(ws["path"]) / ".env").write_text(SECRET)
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    removed = daemon.call("workspace.remove", {"workspace_id": ws["id"]})
    kept_dir = daemon.root / "archive" / ws["id"]
    assert removed["kept"] == {"path": str(kept_dir), "files": [".env"], "raw": []}
    assert (kept_dir / "files" / ".env").read_text() == SECRET
    assert [s["kind"] for s in daemon.call("workspace.strays", {})["strays"]] == ["kept"]


def test_discard_kept_refuses_what_is_not_a_kept_copy(
    env_daemon: tuple[DaemonProcess, dict[str, Any], Path],
) -> None:
    daemon, project, _repo = env_daemon
    ws = create(daemon, project["id"], "a")["workspace"]
    (Path(ws["path"]) / ".env").write_text(SECRET)
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    live_copy = daemon.root / "archive" / ws["id"]
    # An archived workspace's own copy is not a kept copy: unarchive needs it.
    err = rpc_error(daemon, "workspace.discard_kept", {"path": str(live_copy)})
    assert err.kind == "invalid_state"
    assert (live_copy / "files" / ".env").read_text() == SECRET
    for bad in (str(daemon.root / "archive"), str(daemon.root), "/tmp", "relative/path"):
        err = rpc_error(daemon, "workspace.discard_kept", {"path": bad})
        assert err.kind in ("invalid_path", "invalid_params"), (bad, err.kind)
    err = rpc_error(
        daemon, "workspace.discard_kept", {"path": str(daemon.root / "archive" / "ws_0")}
    )
    assert err.kind == "not_found"
    assert (live_copy / "files" / ".env").exists()


def test_archive_sets_an_unsettled_copy_aside_instead_of_replacing_it(
    env_daemon: tuple[DaemonProcess, dict[str, Any], Path],
) -> None:
    """A saved copy of an earlier incarnation still in place (an unarchive that never settled
    it) is the user's: the next archive keeps it aside (a kept stray), never overwrites it."""
    daemon, project, _repo = env_daemon
    ws = create(daemon, project["id"], "a")["workspace"]
    saved = daemon.root / "archive" / ws["id"]
    (saved / "files").mkdir(parents=True)
    (saved / "files" / ".env").write_text(SECRET)
    (saved / "manifest.json").write_text(
        json.dumps({"workspace_id": ws["id"], "incarnation": "earlier", "files": [".env"]})
    )
    (Path(ws["path"]) / ".env").write_text("API_KEY=newer\n")
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    aside = daemon.root / "archive" / f"{ws['id']}.earlier"
    assert (aside / "files" / ".env").read_text() == SECRET
    assert (saved / "files" / ".env").read_text() == "API_KEY=newer\n"
    strays = daemon.call("workspace.strays", {})["strays"]
    assert [(s["kind"], s["path"]) for s in strays] == [("kept", str(aside))]
    assert "set aside" in strays[0]["note"]


def _setup_makes_a_directory_at_env_local(
    daemon: DaemonProcess, project: dict[str, Any], repo: Path
) -> dict[str, Any]:
    """An archived workspace with a preserved `.env.local`, whose branch's setup (trusted) then
    makes `.env.local` a directory."""
    ws = create(daemon, project["id"], "a")["workspace"]
    path = Path(ws["path"])
    (path / ".env.local").write_text("LOCAL=1\n")
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    # Setup (in the checkout's own config, on its branch) now makes `.env.local` a directory.
    config = '[scripts]\nsetup = ["rm -f .env.local; mkdir .env.local"]\npreserve = [".env*"]\n'
    git(repo, "checkout", "-q", "xum/a")
    (repo / ".xum" / "config.toml").write_text(config)
    git(repo, "commit", "-q", "-am", "setup makes a directory")
    git(repo, "checkout", "-q", "main")
    digest = hashlib.sha256(config.encode()).hexdigest()
    daemon.call("project.trust", {"project_id": project["id"], "hash": digest})
    return ws


def test_unverifiable_restore_keeps_the_copy_and_says_where(
    env_daemon: tuple[DaemonProcess, dict[str, Any], Path],
) -> None:
    """A preserved path where setup made a directory: the user's file cannot be put back
    without deleting setup's directory (never done), so the copy is kept and the result says
    where."""
    daemon, project, repo = env_daemon
    ws = _setup_makes_a_directory_at_env_local(daemon, project, repo)
    back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    restored = back["restored"]
    assert restored["unverified"] == [".env.local"]
    kept = Path(restored["kept_at"])
    assert (kept / "files" / ".env.local").read_text() == "LOCAL=1\n"
    assert back["workspace"]["state"] == "active"
    assert [s["path"] for s in daemon.call("workspace.strays", {})["strays"]] == [str(kept)]


def test_copy_that_cannot_be_set_aside_stays_in_place_and_is_reported(
    env_daemon: tuple[DaemonProcess, dict[str, Any], Path],
) -> None:
    """The unverified copy cannot even be moved aside (its directory is immutable: a real
    EPERM): `active` is committed, so the answer is still the unarchive's, with the copy where
    it is, never an error that hides a committed change."""
    daemon, project, repo = env_daemon
    ws = _setup_makes_a_directory_at_env_local(daemon, project, repo)
    saved = daemon.root / "archive" / ws["id"]
    with immutable(saved):
        back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert back["workspace"]["state"] == "active"
    assert back["restored"]["kept_at"] == str(saved)
    assert (saved / "files" / ".env.local").read_text() == "LOCAL=1\n"


def _env_world(world: World) -> dict[str, Any]:
    """`world.repo` with the reported configuration (trusted), and an archived workspace whose
    `.env` holds the user's secret."""
    (world.repo / ".gitignore").write_text("node_modules/\n*.log\n.env\n")
    (world.repo / ".env.example").write_text(EXAMPLE)
    (world.repo / ".xum").mkdir()
    (world.repo / ".xum" / "config.toml").write_text(
        '[scripts]\nsetup = ["cp .env.example .env"]\npreserve = [".env*"]\n'
    )
    git(world.repo, "add", "-A")
    git(world.repo, "commit", "-q", "-m", "env config")
    world.start()
    world.add_project()
    world.call("project.trust", {"project_id": world.project_id})
    ws = world.create("a")
    (Path(ws["path"]) / ".env").write_text(SECRET)
    world.call("workspace.archive", {"workspace_id": ws["id"]})
    world.finish_cleanup()
    return ws


@pytest.mark.parametrize(
    "point",
    [
        "workspace.unarchive.after_checkout",
        "workspace.unarchive.after_restore",
        "workspace.unarchive.after_setup",
        "workspace.unarchive.after_preserved",
        "workspace.unarchive.after_activate",
    ],
)
def test_crash_during_unarchive_never_loses_the_preserved_file(world: World, point: str) -> None:
    """SIGKILL at every step between the restore and the deletion of the saved copy: after the
    restart (and an unarchive again where recovery rolled back) `.env` holds the user's secret,
    not setup's example, and the saved copy is gone only then."""
    ws = _env_world(world)
    saved = world.root / "archive" / ws["id"]
    world.start(point)
    world.expect_killed("workspace.unarchive", {"workspace_id": ws["id"]})
    world.start()
    after = world.ws(ws["id"])
    assert after is not None
    if after["state"] == "archived":
        assert (saved / "files" / ".env").read_text() == SECRET
        world.finish_cleanup()
        world.call("workspace.unarchive", {"workspace_id": ws["id"]})
    elif after["interrupted"]:
        world.call("workspace.keep", {"workspace_id": ws["id"]})
    after = world.ws(ws["id"])
    assert after is not None and after["state"] == "active", after
    assert (Path(ws["path"]) / ".env").read_text() == SECRET
    assert not saved.exists()
    assert world.call("workspace.strays", {})["strays"] == []


def _xum(daemon: DaemonProcess, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "xum"), "--root", str(daemon.root), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode == 0) == ok, done.stdout + done.stderr
    return done


def test_cli_unarchive_rm_strays_and_discard_kept(
    env_daemon: tuple[DaemonProcess, dict[str, Any], Path],
) -> None:
    daemon, project, _repo = env_daemon
    ws = create(daemon, project["id"], "a")["workspace"]
    (Path(ws["path"]) / ".env").write_text(SECRET)
    _xum(daemon, "ws", "archive", "repo/a")
    out = _xum(daemon, "ws", "unarchive", "repo/a").stdout
    assert "your preserved copy replaced what setup wrote: .env" in out
    refused = _xum(daemon, "ws", "rm", "repo/a", ok=False)
    assert ".env" in refused.stderr and "preserve" in refused.stderr
    out = _xum(daemon, "ws", "rm", "--force", "repo/a").stdout
    kept_dir = daemon.root / "archive" / ws["id"]
    assert f"kept 1 preserved file(s) at {kept_dir}" in out
    strays = _xum(daemon, "ws", "strays").stdout
    assert f"kept        {kept_dir}" in strays and "removed workspace" in strays
    assert "xum ws discard-kept PATH" in strays
    out = _xum(daemon, "ws", "discard-kept", str(kept_dir)).stdout
    assert f"deleted {kept_dir} (1 file(s))" in out
    assert not kept_dir.exists()
    assert _xum(daemon, "ws", "strays").stdout.strip() == "no strays"


def test_unarchive_refuses_to_trash_a_lingering_checkout_whose_preserved_file_changed(
    tmp_short: Path, ctl: Path
) -> None:
    """The archive's cleanup is pending (teardown fails), so the old checkout lingers; the user
    edits `.env` there. Unarchive would trash that checkout (forced cleanup) and restore the
    older saved copy: refused `not_safe` naming `.env`, nothing changed."""
    repo = env_repo(tmp_short / "repo")
    config = (repo / ".xum" / "config.toml").read_text()
    (repo / ".xum" / "config.toml").write_text(
        config + f"teardown = [{json.dumps(failing_teardown(ctl))}]\n"
    )
    git(repo, "commit", "-q", "-am", "teardown")
    slow = "[cleanup]\nbackoff_initial_s = 120\nbackoff_max_s = 240\nbackoff_jitter = 0\n"
    with trusted_daemon(tmp_short / "root", repo, slow) as (daemon, project):
        ws = create(daemon, project["id"], "a")["workspace"]
        path = Path(ws["path"])
        (path / ".env").write_text(SECRET)
        archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        assert archived["cleanup"]["status"] == "pending"
        (path / ".env").write_text("API_KEY=edited-after-archive\n")
        err = rpc_error(daemon, "workspace.unarchive", {"workspace_id": ws["id"]})
        assert err.kind == "not_safe" and err.data["files"] == [".env"]
        assert (path / ".env").read_text() == "API_KEY=edited-after-archive\n"
        # Put back as archived: unarchive proceeds and restores the saved copy.
        (path / ".env").write_text(SECRET)
        (ctl / "ok").touch()
        back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
        assert back["workspace"]["state"] == "active"
        assert (path / ".env").read_text() == SECRET


@pytest.fixture
def small_archive(tmp_short: Path) -> Iterator[Path]:
    """ROOT/archive on a 64 KiB tmpfs (real ENOSPC while preserving); unmounted even when the
    test fails."""
    with tmpfs(tmp_short / "root" / "archive", "size=64k") as archive:
        yield archive


def test_archive_that_cannot_save_preserved_files_leaves_no_half_copy(
    tmp_short: Path, small_archive: Path
) -> None:
    repo = env_repo(tmp_short / "repo")
    daemon = DaemonProcess(tmp_short / "root").start()
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "a")["workspace"]
        path = Path(ws["path"])
        (path / ".env").write_text(SECRET)
        big = os.urandom(1 << 20)
        (path / ".env.local").write_bytes(big)
        with pytest.raises(XumClientError):
            daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        after = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
        assert after["state"] == "active"
        assert (path / ".env").read_text() == SECRET
        assert (path / ".env.local").read_bytes() == big
        assert sorted(os.listdir(small_archive)) == [], "a half-written copy was left behind"
    finally:
        daemon.close()


def test_directory_remove_with_force_keeps_its_content_as_a_kept_copy(tmp_short: Path) -> None:
    plain = tmp_short / "plain"
    plain.mkdir()
    daemon = DaemonProcess(tmp_short / "root").start()
    try:
        project = add_project(daemon, plain)
        ws = create(daemon, project["id"], "d", runtime="directory")["workspace"]
        (Path(ws["path"]) / "notes.txt").write_text("mine\n")
        err = rpc_error(daemon, "workspace.remove", {"workspace_id": ws["id"]})
        assert err.kind == "not_safe" and err.data["files"] == ["notes.txt"]
        removed = daemon.call("workspace.remove", {"workspace_id": ws["id"], "force": True})
        kept = Path(removed["kept"]["path"])
        assert removed["kept"]["files"] == ["notes.txt"]
        assert (kept / "content" / "notes.txt").read_text() == "mine\n"
        (stray,) = daemon.call("workspace.strays", {})["strays"]
        assert (stray["kind"], stray["path"], stray["kept_files"]) == (
            "kept",
            str(kept),
            ["notes.txt"],
        )
    finally:
        daemon.close()


def test_restore_never_writes_through_a_symlinked_directory_out_of_the_checkout(
    env_daemon: tuple[DaemonProcess, dict[str, Any], Path], tmp_short: Path
) -> None:
    """The branch now has `sub` as a symlink to a directory outside the checkout: the preserved
    `sub/.env` is not written there (before or after setup); the copy is kept and reported."""
    daemon, project, repo = env_daemon
    ws = create(daemon, project["id"], "a")["workspace"]
    path = Path(ws["path"])
    (path / "sub").mkdir()
    (path / "sub" / ".env").write_text(SECRET)
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    outside = tmp_short / "outside"
    outside.mkdir()
    git(repo, "checkout", "-q", "xum/a")
    (repo / "sub").symlink_to(outside)
    git(repo, "add", "sub")
    git(repo, "commit", "-q", "-m", "sub is a link")
    git(repo, "checkout", "-q", "main")
    back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert os.listdir(outside) == [], "a preserved file was written outside the checkout"
    restored = back["restored"]
    assert restored["unverified"] == ["sub/.env"]
    assert (Path(restored["kept_at"]) / "files" / "sub" / ".env").read_text() == SECRET


def test_preserved_file_in_a_directory_of_only_ignored_files_is_saved_once(
    env_daemon: tuple[DaemonProcess, dict[str, Any], Path],
) -> None:
    """git lists `config/` *and* `config/.env` when the directory holds only ignored files: the
    archive counts and copies the file once (it failed `internal` on the second copy)."""
    daemon, project, _repo = env_daemon
    ws = create(daemon, project["id"], "a")["workspace"]
    path = Path(ws["path"])
    (path / "config").mkdir()
    (path / "config" / ".env").write_text(SECRET)
    archived = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert sorted(archived["dropped"]["preserved"]) == [".env", "config/.env"]
    assert archived["dropped"]["count"] == 0
    back = daemon.call("workspace.unarchive", {"workspace_id": ws["id"]})
    assert (path / "config" / ".env").read_text() == SECRET
    assert back["restored"]["unverified"] == []


def test_an_ignored_symlink_to_a_directory_is_one_entry_never_walked_into(tmp_path: Path) -> None:
    """An ignored `cache -> /elsewhere` is the link itself: counted and preserved as one
    entry, never the files of the directory it points to (outside the checkout)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.env").write_text("not the checkout's\n")
    checkout = tmp_path / "co"
    checkout.mkdir()
    (checkout / "cache").symlink_to(outside)
    snapshots = Snapshotter(Git(), tmp_path / "tmp", tmp_path / "archive")
    assert snapshots.preserved_files(checkout, ["cache"], ["*"]) == ["cache"]
