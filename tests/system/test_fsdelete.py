"""The deletion primitive and the mount table, against real bind mounts and tmpfs (root only;
skipped with the reason elsewhere): nothing on another device or mount is ever entered or
removed, symlinks are never followed, hard links keep their data."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xumd.system import fsdelete, walk
from xumd.system.platform import linux

from tests.support.mounts import Mounts, mounts_under, real_mounts
from tests.support.platform import fail_mount_table


@pytest.fixture
def mounts(tmp_short: Path) -> Iterator[Mounts]:
    with real_mounts(tmp_short) as m:
        yield m


def _outside(tmp_short: Path) -> Path:
    """A directory outside the tree with data that must survive (a user's cache)."""
    outside = tmp_short / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "keep.txt").write_text("precious\n")
    (outside / "deep" / "more.txt").write_text("also precious\n")
    return outside


def _snapshot(top: Path) -> dict[str, str]:
    found = {}
    for dirpath, dirs, files in os.walk(top):
        for name in dirs + files:
            path = Path(dirpath, name)
            rel = str(path.relative_to(top))
            found[rel] = (
                os.readlink(path)
                if path.is_symlink()
                else (path.read_text() if path.is_file() else "<dir>")
            )
    return found


def test_mountinfo_decodes_octal_escapes() -> None:
    line = (
        rb"36 35 98:0 / /mnt/a\040b\011c\012d\134e rw,noatime master:1 - ext3 /dev/root rw"
        + b"\n"
        + "37 35 98:0 / /mnt/caf\u00e9 rw - ext3 /dev/root rw\n".encode()
        + b"short line\n"
    )
    assert [point for point, _type in linux.parse_mount_table(line)] == [
        "/mnt/a b\tc\nd\\e",
        "/mnt/caf\u00e9",
    ]


def test_mount_table_gives_the_type_after_the_separator() -> None:
    # diskfull names a full filesystem by its type from this one parser: the type follows the
    # `-` ending the optional fields (none, one or several), whatever the mount point spells.
    table = (
        rb"36 35 98:0 / /mnt/a\040b rw,noatime master:1 shared:2 - tmpfs tmpfs rw" + b"\n"
        b"37 35 98:0 / /mnt/plain rw - ext4 /dev/root rw\n"
        b"38 35 98:0 / /mnt/odd rw no separator here\n"
    )
    assert fsdelete.parse_mount_table(table) == [
        ("/mnt/a b", "tmpfs"),
        ("/mnt/plain", "ext4"),
        ("/mnt/odd", None),
    ]


def test_mounts_found_at_and_under_a_path_with_spaces(tmp_short: Path, mounts: Mounts) -> None:
    top = tmp_short / "check out"
    (top / "a dir" / "sub").mkdir(parents=True)
    (tmp_short / "check outside").mkdir()
    mounts.tmpfs(top / "a dir" / "sub")
    assert fsdelete.mounts_at_or_under(top) == [str(top / "a dir" / "sub")]
    # A sibling whose name only starts with the same characters is not "under".
    assert fsdelete.mounts_at_or_under(tmp_short / "check outside") == []
    # A mount on the path itself; spelled through a symlink, still found.
    mounts.tmpfs(top)
    link = tmp_short / "link"
    link.symlink_to(top)
    assert str(top) in fsdelete.mounts_at_or_under(link)


def test_delete_tree_stops_at_every_mount(tmp_short: Path, mounts: Mounts) -> None:
    outside = _outside(tmp_short)
    (outside / "single.txt").write_text("single\n")
    before = _snapshot(outside)
    tmp_src = tmp_short / "tmpfs-src"
    top = tmp_short / "trash-entry"
    for sub in ("mnt", "same-fs", "nested/deeper/cache", "plain/x", "ro"):
        (top / sub).mkdir(parents=True)
    (top / "file.txt").write_text("x" * 100)
    (top / "plain" / "x" / "y.txt").write_text("y" * 10)
    (top / "file-mount").write_text("")
    # A bind mount of another filesystem (tmpfs), a bind mount of this same filesystem (same
    # st_dev: only the mount id tells), a nested one, and a file bind mount.
    tmp_src.mkdir()
    mounts.tmpfs(tmp_src)
    (tmp_src / "data.bin").write_bytes(b"\0" * 1000)
    mounts.bind(tmp_src, top / "mnt")
    mounts.bind(outside, top / "same-fs")
    mounts.bind(outside / "deep", top / "nested" / "deeper" / "cache")
    mounts.bind(outside / "single.txt", top / "file-mount")
    # Symlinks out of the tree and a hard link to a file outside.
    (top / "link-dir").symlink_to(outside)
    (top / "link-file").symlink_to(outside / "keep.txt")
    os.link(outside / "keep.txt", top / "hard")
    # A read-only directory with a file inside (package caches do this).
    (top / "ro" / "f").write_text("z")
    os.chmod(top / "ro", 0o555)

    report = fsdelete.delete_tree(top)

    assert sorted(report.left) == sorted(
        str(top / p) for p in ("mnt", "same-fs", "nested/deeper/cache", "file-mount")
    )
    assert _snapshot(outside) == before
    assert (tmp_src / "data.bin").read_bytes() == b"\0" * 1000
    assert (outside / "single.txt").read_text() == "single\n"
    # Everything else went; the directories above a mount stay (they are not empty).
    assert sorted(os.listdir(top)) == ["file-mount", "mnt", "nested", "same-fs"]
    assert os.listdir(top / "nested") == ["deeper"]
    # Freed: the 100-byte file, y.txt (10), ro/f (1); the hard link's data is still linked.
    assert report.freed == 111
    # Once unmounted, the next call finishes the job.
    mounts.close()
    again = fsdelete.delete_tree(top)
    assert again.complete and not top.exists()
    assert _snapshot(outside) == before


def test_delete_tree_leaves_a_mount_over_the_top_whole(tmp_short: Path, mounts: Mounts) -> None:
    top = tmp_short / "entry"
    top.mkdir()
    (top / "under.txt").write_text("under the mount\n")
    mounts.tmpfs(top)
    (top / "on-mount.txt").write_text("on the mount\n")
    report = fsdelete.delete_tree(top)
    assert report.left == [str(top)]
    assert (top / "on-mount.txt").read_text() == "on the mount\n"
    mounts.close()
    assert (top / "under.txt").read_text() == "under the mount\n"


def test_delete_tree_never_follows_a_symlink_at_the_top(tmp_short: Path) -> None:
    outside = _outside(tmp_short)
    link = tmp_short / "entry"
    link.symlink_to(outside)
    with pytest.raises(OSError):
        fsdelete.delete_tree(link)
    assert (outside / "keep.txt").exists()


def test_delete_tree_deeper_than_its_descriptor_window(tmp_short: Path) -> None:
    top = tmp_short / "deep"
    path = top
    for _ in range(walk.WINDOW * 3):
        path = path / "d"
    path.mkdir(parents=True)
    (path / "leaf").write_text("leaf")
    os.chmod(path, 0o500)
    before = len(os.listdir("/proc/self/fd"))
    report = fsdelete.delete_tree(top)
    assert report.complete and not top.exists()
    assert len(os.listdir("/proc/self/fd")) == before  # no descriptor leaked


def test_delete_tree_detects_an_ancestor_moved_away(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ancestor whose descriptor was closed (beyond the window) is moved out of the tree
    mid-walk: going back up through `..` would land in its new parent, so the walk checks the
    identity and stops (Moved) instead of removing an entry there that has the same name."""
    top = tmp_short / "deep"
    path = top
    for _ in range(walk.WINDOW + 5):
        path = path / "d"
    path.mkdir(parents=True)
    bystander = tmp_short / "d"  # same name as the moved directory, in its new parent
    bystander.mkdir()
    real_scandir = os.scandir
    moved = tmp_short / "elsewhere"
    moved.mkdir()

    def scandir_then_move(fd: int) -> contextlib.nullcontext[list[os.DirEntry[str]]]:
        with real_scandir(fd) as it:
            entries = list(it)
        if not entries and not (moved / "d").exists():
            os.rename(top / "d" / "d", moved / "d")  # its descriptor is closed by now
        return contextlib.nullcontext(entries)

    monkeypatch.setattr(walk.os, "scandir", scandir_then_move)
    with pytest.raises(walk.Moved):
        fsdelete.delete_tree(top)
    monkeypatch.undo()
    assert bystander.is_dir()
    assert (moved / "d").is_dir()


def test_delete_tree_interrupted_and_resumed(tmp_short: Path) -> None:
    top = tmp_short / "entry"
    (top / "a").mkdir(parents=True)
    (top / "a" / "f").write_text("f")
    stop = threading.Event()
    stop.set()
    with pytest.raises(fsdelete.Interrupted):
        fsdelete.delete_tree(top, stop)
    assert (top / "a" / "f").exists()
    assert fsdelete.delete_tree(top).complete and not top.exists()


def test_same_mount_tells_bind_mounts_of_one_filesystem_apart(
    tmp_short: Path, mounts: Mounts
) -> None:
    a, b, c = tmp_short / "a", tmp_short / "b", tmp_short / "c"
    for d in (a, b, c):
        d.mkdir()
    assert fsdelete.same_mount(a, b)
    mounts.bind(c, b)
    assert os.stat(a).st_dev == os.stat(b).st_dev  # st_dev alone cannot tell
    assert not fsdelete.same_mount(a, b)
    assert mounts_under(tmp_short) == [str(b)]


def test_remove_tree_absent_and_mode_000_directory(tmp_short: Path) -> None:
    assert fsdelete.remove_tree(tmp_short / "nothing") == []
    top = tmp_short / "entry"
    (top / "closed").mkdir(parents=True)
    (top / "closed" / "f").write_text("f")
    os.chmod(top / "closed", 0)
    assert fsdelete.remove_tree(top) == []
    assert not top.exists()
    assert stat.S_ISDIR(os.stat(tmp_short).st_mode)


def test_walk_within_never_enters_a_mount(tmp_short: Path, mounts: Mounts) -> None:
    outside = _outside(tmp_short)
    top = tmp_short / "checkout"
    (top / "src").mkdir(parents=True)
    (top / "src" / "a.py").write_text("a")
    (top / "same-fs").mkdir()
    (top / "tmp").mkdir()
    (top / "link").symlink_to(outside)
    mounts.bind(outside, top / "same-fs")
    mounts.tmpfs(top / "tmp")
    (top / "tmp" / "t.txt").write_text("t")
    listed = sorted(
        str(Path(d, f).relative_to(top)) for d, _, fs in fsdelete.walk_within(top) for f in fs
    )
    assert listed == ["src/a.py"]
    assert list(fsdelete.walk_within(tmp_short / "absent")) == []


def _row(path: Path, runtime: str, wid: str = "ws_0123456789abcdef") -> Any:
    from xumd.lifecycle.rows import WorkspaceRow

    return WorkspaceRow(
        id=wid, project_id="prj_0123456789abcdef", name=path.name, runtime=runtime, path=path,
        branch="xum/w" if runtime == "worktree" else None, base=None, branch_created=False,
        state="creating", incarnation="0" * 32, dev=None, ino=None, interrupted=False,
        interrupted_reason=None, setup_status="none", setup_output=None, snapshot_ref=None,
        snapshot_commit=None, last_cleanup=None, handle_id=None, owner_workspace_id=None,
        auto_archive=None, auto_archive_outcome=None, version=1, created_at=0.0, updated_at=0.0,
    )  # fmt: skip


@pytest.mark.parametrize("runtime", ["worktree", "directory"])
def test_discard_leaves_a_checkout_with_a_mount_alone(
    tmp_short: Path, mounts: Mounts, runtime: str
) -> None:
    """The undo of a failed create or unarchive (`materialise.discard`): `git worktree remove -f
    -f` (or the directory delete) would empty a mount a setup script put inside the checkout."""
    import anyio
    from xumd.checkouts import marker
    from xumd.lifecycle import materialise
    from xumd.system.git import Git

    from tests.support.gitrepo import git, make_repo

    outside = _outside(tmp_short)
    before = _snapshot(outside)
    repo = make_repo(tmp_short / "repo")
    path = tmp_short / "w"
    row = _row(path, runtime)
    if runtime == "worktree":
        reason = marker.Marker(row.id, row.incarnation).reason()
        git(repo, "worktree", "add", "--lock", "--reason", reason, "-b", "xum/w", str(path))
    else:
        materialise.make_directory(row)
    (path / "cache").mkdir()
    point = mounts.bind(outside, path / "cache")
    anyio.run(materialise.discard, Git(), repo, row)
    assert _snapshot(outside) == before
    assert path.is_dir()
    mounts.unmount(point)
    anyio.run(materialise.discard, Git(), repo, row)
    assert not path.exists()
    assert _snapshot(outside) == before


def test_an_unreadable_mount_table_fails_closed(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quiescence check cannot prove no mount is inside: a `probe` holder (busy), never an
    empty answer. (The fault is simulated: the table's path names a directory, EISDIR; psutil's
    partitions raise EACCES on the portable backend.)"""
    import anyio
    from xumd.checkouts.marker import WorkspaceRef
    from xumd.lifecycle.hooks import mount_holders

    (tmp_short / "f").write_text("f")
    fail_mount_table(monkeypatch, tmp_short)
    ref = WorkspaceRef("ws_0123456789abcdef", "prj_0123456789abcdef", "w", tmp_short, "0")
    holders = anyio.run(mount_holders, ref)
    assert [(h.kind, h.pid) for h in holders] == [("probe", None)]
    assert "mount table unreadable" in holders[0].label
    with pytest.raises(OSError):
        fsdelete.mounts_at_or_under(tmp_short)
    # A usage walk still answers (its device check holds without the table).
    assert [f for _, _, fs in fsdelete.walk_within(tmp_short) for f in fs] == ["f"]


def test_delete_tree_is_not_redirected_by_a_symlink_swap(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the walk's look at a directory entry and its descent, the directory is moved
    out of the tree and a symlink to the user's files put in its place: the walk opens by
    descriptor without following, sees the link, and unlinks the link itself."""
    outside = _outside(tmp_short)
    before = _snapshot(outside)
    top = tmp_short / "entry"
    (top / "sub").mkdir(parents=True)
    (top / "sub" / "f").write_text("f")
    moved = tmp_short / "moved-out"
    real_stat = os.stat

    def stat_then_swap(name: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        st = real_stat(name, *args, **kwargs)
        if name == "sub" and not moved.exists():
            os.rename(top / "sub", moved)
            os.symlink(outside, top / "sub")
        return st

    monkeypatch.setattr(fsdelete.os, "stat", stat_then_swap)
    report = fsdelete.delete_tree(top)
    monkeypatch.undo()
    assert report.complete and not top.exists()
    assert _snapshot(outside) == before
    assert (moved / "f").read_text() == "f"  # moved out of the tree first: not ours to delete


def test_unreadable_directories_as_an_ordinary_user(tmp_short: Path, mounts: Mounts) -> None:
    """As an ordinary user (root reads every directory, so this path needs another uid): a
    mode-000 and a read-only directory of the tree are made accessible and deleted; a mode-000
    mount below is not ours to chmod: left alone, its mode unchanged."""
    import json

    uid = 65534
    top = tmp_short / "entry"
    for sub in ("closed/inner", "readonly", "mnt"):
        (top / sub).mkdir(parents=True)
    (top / "closed" / "inner" / "f").write_text("f")
    (top / "readonly" / "g").write_text("g")
    mounts.tmpfs(top / "mnt", options=f"mode=000,uid={uid},gid={uid}")
    (top / "mnt" / "theirs").write_text("theirs")
    for dirpath, dirs, files in os.walk(top):
        for name in [*dirs, *files, "."]:
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)
    os.chmod(tmp_short, 0o777)  # the child may remove `entry` from it
    os.chmod(top / "closed", 0)
    os.chmod(top / "readonly", 0o555)
    os.chmod(top / "mnt", 0)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to the ordinary user, delete, report, exit
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            report = fsdelete.delete_tree(top)
            os.write(write, json.dumps({"left": report.left, "freed": report.freed}).encode())
        except BaseException as exc:
            os.write(write, json.dumps({"error": repr(exc)}).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert answer == {"left": [str(top / "mnt")], "freed": 2}
    assert sorted(os.listdir(top)) == ["mnt"]
    assert stat.S_IMODE(os.stat(top / "mnt").st_mode) == 0
    assert (top / "mnt" / "theirs").read_text() == "theirs"
