"""`xumd.system.smallfile` and the git admin file reader built on it: a named pipe, a symlink, a
device or a huge file where a small file is expected is refused at once (never waited on,
never read without bound). Real FIFOs, links and files."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import structlog.testing
from xumd.checkouts.adminfile import ADMIN_FILE_MAX, read_admin_file
from xumd.system import smallfile

from tests.support.daemon import DaemonProcess


def test_what_is_not_a_small_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100)
    plain = tmp_path / "plain"
    plain.write_text("gitdir\n")
    link = tmp_path / "link"
    link.symlink_to(plain)
    for path, error in ((fifo, errno.EINVAL), (Path("/dev/zero"), errno.EINVAL)):
        with pytest.raises(OSError) as refused:
            smallfile.read_regular(path, 1 << 20)
        assert refused.value.errno == error
        with pytest.raises(OSError):
            smallfile.read_head(path, 8)
    with pytest.raises(OSError) as refused:
        smallfile.read_regular(big, 99)
    assert refused.value.errno == errno.EFBIG
    assert smallfile.read_regular(big, 100) == b"x" * 100
    assert smallfile.read_head(big, 8) == b"x" * 8
    assert smallfile.read_regular(link, 100) == b"gitdir\n"
    with pytest.raises(OSError) as refused:
        smallfile.read_regular(link, 100, follow_symlinks=False)
    assert refused.value.errno == errno.ELOOP


def test_an_admin_file_that_is_not_a_plain_small_file_is_unreadable(tmp_path: Path) -> None:
    """Unreadable (None) proves nothing: the callers leave the admin entry alone."""
    (tmp_path / "gitdir").write_text("/somewhere/.git\n")
    assert read_admin_file(tmp_path / "gitdir") == "/somewhere/.git\n"
    os.mkfifo(tmp_path / "locked")
    assert read_admin_file(tmp_path / "locked") is None
    (tmp_path / "link").symlink_to(tmp_path / "gitdir")
    assert read_admin_file(tmp_path / "link") is None
    (tmp_path / "huge").write_bytes(b"y" * (ADMIN_FILE_MAX + 1))
    assert read_admin_file(tmp_path / "huge") is None
    assert read_admin_file(tmp_path / "missing") is None


def test_read_head_follows_a_symlink_to_a_regular_file_and_refuses_one_to_a_fifo(
    tmp_path: Path,
) -> None:
    """The index header is read where git reads it: through a symlink (unlike an admin file),
    but still never from a named pipe."""
    plain = tmp_path / "index"
    plain.write_bytes(b"DIRC\x00\x00\x00\x02rest")
    (tmp_path / "link").symlink_to(plain)
    assert smallfile.read_head(tmp_path / "link", 8) == b"DIRC\x00\x00\x00\x02"
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "to-fifo").symlink_to(tmp_path / "fifo")
    with pytest.raises(OSError) as refused:
        smallfile.read_head(tmp_path / "to-fifo", 8)
    assert refused.value.errno == errno.EINVAL


def test_an_admin_file_unreadable_for_a_reason_is_logged_and_a_missing_one_is_not(
    tmp_path: Path,
) -> None:
    """Missing (or a symlink, never followed) is the ordinary case of an entry that is not
    ours; a FIFO or a huge file where git keeps a small one is worth a line in the log."""
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    os.mkfifo(tmp_path / "fifo")
    with structlog.testing.capture_logs() as logs:
        assert read_admin_file(tmp_path / "missing") is None
        assert read_admin_file(tmp_path / "link") is None
        assert read_admin_file(tmp_path / "fifo") is None
    logged = [e for e in logs if e["event"] == "checkouts.admin_file_unreadable"]
    assert [e["path"] for e in logged] == [str(tmp_path / "fifo")]


def test_markers_that_are_fifos_are_no_markers_and_never_waited_on(tmp_path: Path) -> None:
    """The markers live in the user's checkout (`.xum-incarnation`, the `.git` file) and the
    repository (`locked`): each replaced by a named pipe is no marker, answered at once."""
    from xumd.checkouts import marker

    directory = tmp_path / "dir-checkout"
    directory.mkdir()
    os.mkfifo(directory / marker.DIRECTORY_MARKER)
    assert marker.read_directory_marker(directory) is None
    worktree = tmp_path / "wt-checkout"
    worktree.mkdir()
    os.mkfifo(worktree / ".git")
    assert marker.worktree_admin_dir(worktree) is None
    admin = tmp_path / "admin"
    admin.mkdir()
    (worktree / ".git").unlink()
    (worktree / ".git").write_text(f"gitdir: {admin}\n")
    os.mkfifo(admin / "locked")
    assert marker.worktree_admin_dir(worktree) == admin
    assert marker.read_worktree_marker(worktree) is None
    # The same files, written as the daemon writes them, are markers (the test can fail).
    (admin / "locked").unlink()
    (admin / "locked").write_text("xum ws_1 inc1\n")
    assert marker.read_worktree_marker(worktree) == marker.Marker("ws_1", "inc1")
    (directory / marker.DIRECTORY_MARKER).unlink()
    marker.write_directory_marker(directory, marker.Marker("ws_2", "inc2"))
    assert marker.read_directory_marker(directory) == marker.Marker("ws_2", "inc2")


def test_a_relative_gitdir_is_resolved_from_the_checkout(tmp_path: Path) -> None:
    """git writes a relative `gitdir:` with `worktree.useRelativePaths`: the admin dir is then
    relative to the checkout, not to the daemon's working directory."""
    from xumd.checkouts import marker

    admin = tmp_path / "repo" / ".git" / "worktrees" / "w"
    admin.mkdir(parents=True)
    (admin / "locked").write_text("xum ws_3 inc3\n")
    checkout = tmp_path / "checkouts" / "w"
    checkout.mkdir(parents=True)
    (checkout / ".git").write_text("gitdir: ../../repo/.git/worktrees/w\n")
    assert marker.worktree_admin_dir(checkout) == admin.resolve()
    assert marker.read_marker(checkout) == marker.Marker("ws_3", "inc3")


def test_a_commondir_that_is_a_fifo_is_no_common_dir(tmp_path: Path) -> None:
    """A linked worktree's admin dir names its common dir in `commondir`; a FIFO there is read
    as no name (the admin dir itself), at once."""
    from xumd.system import gitlocks

    admin = tmp_path / "repo" / ".git" / "worktrees" / "w"
    admin.mkdir(parents=True)
    (admin / "commondir").write_text("../..\n")
    assert gitlocks.common_dir_of(str(admin)) == str(tmp_path / "repo" / ".git")
    (admin / "commondir").unlink()
    os.mkfifo(admin / "commondir")
    assert gitlocks.common_dir_of(str(admin)) == str(admin)


def test_strays_answer_with_a_fifo_in_an_admin_entry(daemon: DaemonProcess, repo: Path) -> None:
    """`workspace.strays` reads every admin entry's `gitdir` of the project's repository: one
    that is a named pipe (a hostile repository) is skipped and the daemon answers (it hung,
    in the event loop's thread, before: the client's timeout is its bound here). A real
    daemon."""
    project = daemon.call("project.add", {"path": str(repo)})["project"]
    admin = repo / ".git" / "worktrees" / "hostile"
    admin.mkdir(parents=True)
    os.mkfifo(admin / "gitdir")
    with daemon.client(timeout=20) as client:
        answer = client.call("workspace.strays", {"project_id": project["id"]})
    assert answer["strays"] == [], answer
    assert daemon.call("daemon.status")["details"] is not None  # still serving
