"""An error from a descriptor walk names the path it is about, relative to the walk's top
(`build/out.o`), and the reason: the descriptor call itself knows only the entry's own name
(`Permission denied: 'out.o'`). Real files the kernel refuses to delete (`chattr +i`, EPERM even
for root) or to read (another user's mode-000 file), through the real daemon's reclaim and at the
module level (fsdelete, fscopy)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from xumd.system import fscopy, fsdelete

from tests.support.daemon import DaemonProcess, short_tmpdir, write_config
from tests.support.fsattr import immutable
from tests.support.gitrepo import make_repo
from tests.support.otheruser import NOBODY, as_nobody

EPERM = "Operation not permitted"
EACCES = "Permission denied"
# Retried by the daemon only minutes later: the failed reclaim is read as it failed.
SLOW_RETRY = "[cleanup]\nbackoff_initial_s = 120\nbackoff_max_s = 240\nbackoff_jitter = 0\n"


def _build_output(top: Path) -> Path:
    (top / "build").mkdir(parents=True)
    (top / "build" / "keep.txt").write_text("keep")
    out = top / "build" / "out.o"
    out.write_bytes(b"\x7fELF")
    return out


def test_delete_tree_names_the_file_it_may_not_delete(tmp_short: Path) -> None:
    top = tmp_short / "entry"
    out = _build_output(top)
    with immutable(out), pytest.raises(PermissionError) as caught:
        fsdelete.delete_tree(top)
    assert caught.value.filename == "build/out.o"
    assert str(caught.value).endswith(f"{EPERM}: 'build/out.o'"), str(caught.value)
    # Nothing else about the error changed: its class and errno still say what it was.
    assert caught.value.errno == 1
    fsdelete.delete_tree(top)  # once the kernel lets go, the same walk completes
    assert not top.exists()


def test_delete_tree_as_an_ordinary_user_names_another_user_s_file(tmp_short: Path) -> None:
    """A root-owned build output in a sticky directory of an ordinary user's tree: unlinking it
    is refused (EPERM), and so is making its directory writable."""
    top = tmp_short / "entry"
    _build_output(top)
    os.chown(top, NOBODY, NOBODY)
    os.chmod(tmp_short, 0o777)
    os.chmod(top / "build", 0o1777)

    def delete() -> str:
        try:
            fsdelete.delete_tree(top)
        except OSError as exc:
            return str(exc)
        return "deleted"

    said = as_nobody(delete)
    assert "'build/" in said and EPERM in said, said
    assert (top / "build" / "out.o").exists()


def test_a_copy_names_the_file_or_directory_it_cannot_read(tmp_short: Path) -> None:
    src, dest = tmp_short / "src", tmp_short / "dest"
    _build_output(src)
    (src / "build" / "sub").mkdir()
    dest.mkdir()
    os.chmod(tmp_short, 0o755)
    os.chown(dest, NOBODY, NOBODY)
    os.chmod(src / "build" / "out.o", 0)

    def copy(what: str) -> str:
        try:
            fscopy.copy_tree(src, dest / what)
        except OSError as exc:
            return str(exc)
        return "copied"

    said = as_nobody(lambda: copy("a"))
    assert said.endswith(f"{EACCES}: 'build/out.o'"), said  # the copy's walk
    os.chmod(src / "build" / "out.o", 0o644)
    os.chmod(src / "build" / "sub", 0)
    said = as_nobody(lambda: copy("b"))
    assert said.endswith(f"{EACCES}: 'build/sub'"), said  # the count before the copy
    # An entry's count (a seed's plan) names the path below the entry too.
    os.chmod(src / "build" / "sub", 0o755)
    (src / "build" / "sub" / "x").mkdir()
    os.chmod(src / "build" / "sub" / "x", 0)
    said = as_nobody(lambda: _tally_at(src, "build"))
    assert said.endswith(f"{EACCES}: 'build/sub/x'"), said


def _tally_at(src: Path, name: str) -> str:
    fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fscopy.tally_at(fd, name)
    except OSError as exc:
        return str(exc)
    finally:
        os.close(fd)
    return "counted"


@pytest.fixture
def daemon() -> Iterator[DaemonProcess]:
    base = short_tmpdir()
    write_config(base / "root", SLOW_RETRY)
    running = DaemonProcess(base / "root").start()
    try:
        yield running
    finally:
        running.close()
        shutil.rmtree(base, ignore_errors=True)


def test_a_reclaim_blocked_by_a_file_says_which_one_and_why(daemon: DaemonProcess) -> None:
    """Archive a workspace whose checkout holds a build output the daemon may not delete: the
    checkout goes to the trash, and the reclaim of the trash entry stays pending naming
    `build/out.o` (relative to the trash entry, which the error names first) and the kernel's
    reason in its `last_error`."""
    repo = make_repo(daemon.root.parent / "proj")
    project = daemon.call("project.add", {"path": str(repo), "name": "proj"})["project"]
    ws = daemon.call("workspace.create", {"project_id": project["id"], "name": "a"})["workspace"]
    out = _build_output(Path(ws["path"]))
    done = subprocess.run(["chattr", "+i", str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot make {out} immutable here (needs root, ext4): {done.stderr}")
    try:
        answer = daemon.call("workspace.archive", {"workspace_id": ws["id"]})
        assert answer["workspace"]["state"] == "archived", answer
        # The checkout is in the trash; its reclaim (deleting the entry) is what the file blocks.
        retried = daemon.call("cleanup.retry", {"workspace_id": ws["id"]})
        assert retried["workspaces"][ws["id"]]["reclaim"]["status"] == "pending", retried
        listed = daemon.call("cleanup.list", {"workspace_id": ws["id"]})["obligations"]
        (reclaim,) = [o for o in listed if o["kind"] == "reclaim"]
        assert reclaim["state"] == "pending", reclaim
        assert reclaim["last_error"].endswith(f"{EPERM}: 'build/out.o'"), reclaim
    finally:
        # Wherever the file is now (moved with the checkout into the trash).
        for found in daemon.root.rglob("out.o"):
            subprocess.run(["chattr", "-i", str(found)], capture_output=True, check=False)
        subprocess.run(["chattr", "-i", str(out)], capture_output=True, check=False)
    retried = daemon.call("cleanup.retry", {"workspace_id": ws["id"]})
    assert retried["workspaces"][ws["id"]]["reclaim"]["status"] == "completed", retried


def test_opening_an_entry_s_parents_names_the_directory_it_cannot_enter(tmp_short: Path) -> None:
    """A copy of one entry (`build/sub/x/out.o`: a seed's ignored file, a raw entry) opens its
    parents one by one: the directory that refuses is named by its path, not its last name."""
    top = tmp_short / "src"
    (top / "build" / "sub" / "x").mkdir(parents=True)
    os.chmod(tmp_short, 0o755)
    os.chmod(top / "build" / "sub", 0)

    def open_it() -> str:
        fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.close(fscopy.open_parents(fd, ["build", "sub", "x", "out.o"]))
        except OSError as exc:
            return str(exc)
        finally:
            os.close(fd)
        return "opened"

    said = as_nobody(open_it)
    assert said.endswith(f"{EACCES}: 'build/sub'"), said
