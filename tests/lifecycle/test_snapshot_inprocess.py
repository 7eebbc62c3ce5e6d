"""The snapshotter driven in-process: real git repositories in a temp dir, no daemon.

Each test pins one rule of `lifecycle/snapshot.py` by behaviour: what a snapshot holds (staged,
unstaged, untracked, binary, symlinks, deletions), that the user's index is never written, what
a restore puts back and what it never deletes, which ignored files are reported and which are
preserved, and the failure paths (a git command that fails, a full archive filesystem). It is the
fast selection `make mutate` runs for this module (seconds, where the daemon tests take minutes).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from xumd.base.errors import ErrorKind, XumError
from xumd.lifecycle import onbytes
from xumd.lifecycle.snapshot import (
    MAX_SPECIAL,
    Dropped,
    Snapshot,
    Snapshotter,
    WorkState,
    snapshot_ref,
)
from xumd.system import fscopy
from xumd.system.git import Git, GitError

from tests.support.daemon import short_tmpdir
from tests.support.gitrepo import git, make_repo
from tests.support.otheruser import as_nobody
from tests.support.tmpfs import tmpfs

WS = "ws-1"
INC = "inc-1"
BINARY = bytes(range(256)) * 4 + b"\0\0tail"


def snapper(tmp_path: Path, git_: Git | None = None) -> Snapshotter:
    # Nested directories that do not exist yet: the snapshotter makes them itself.
    return Snapshotter(git_ or Git(), tmp_path / "t" / "tmp", tmp_path / "a" / "archive")


def repo(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "co",
        {
            "a.txt": "a\n",
            "gone.txt": "gone\n",
            "sub/b.txt": "b\n",
            "sub/gone2.txt": "gone2\n",
            "out/f.txt": "f\n",
            ".gitignore": "*.log\n",
        },
    )


def index_digest(checkout: Path) -> str:
    return hashlib.sha256((checkout / ".git" / "index").read_bytes()).hexdigest()


def make_dirty(checkout: Path) -> None:
    (checkout / "a.txt").write_text("a changed, unstaged\n")
    (checkout / "sub" / "b.txt").write_text("b changed, staged\n")
    git(checkout, "add", "sub/b.txt")
    (checkout / "new.txt").write_text("untracked\n")
    (checkout / "bin.dat").write_bytes(BINARY)
    (checkout / "link").symlink_to("a.txt")
    (checkout / "gone.txt").unlink()  # an unstaged deletion
    git(checkout, "rm", "-q", "sub/gone2.txt")  # a staged deletion
    (checkout / "x.log").write_text("ignored: never snapshotted\n")


DIRTY_FILES = ["a.txt", "bin.dat", "gone.txt", "link", "new.txt", "sub/b.txt", "sub/gone2.txt"]


def wrapper_git(tmp_path: Path, *failing: str) -> Git:
    """A git that fails the commands `failing` (a forced fault: the command errors as a broken
    repository would) and runs every other command as the real git."""
    real = shutil.which("git")
    assert real is not None
    script = tmp_path / f"git-failing-{'-'.join(failing)}"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$3" in {"|".join(failing)}) echo "fatal: forced failure of $3" >&2; exit 128;; '
        "esac\n"
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    return Git(binary=str(script))


# -- capture and take ---------------------------------------------------------------------------


def test_dirty_is_a_difference_of_either_tree_from_head() -> None:
    assert not WorkState("h", "t", "t", "t").dirty
    assert WorkState("h", "t", "staged", "t").dirty
    assert WorkState("h", "t", "t", "work").dirty
    assert WorkState("h", "t", "staged", "work").dirty


async def test_a_clean_checkout_has_nothing_to_snapshot(tmp_path: Path) -> None:
    checkout = repo(tmp_path)
    snaps = snapper(tmp_path)
    state = await snaps.capture(checkout)
    head_tree = git(checkout, "rev-parse", "HEAD^{tree}").strip()
    assert state.head == git(checkout, "rev-parse", "HEAD").strip()
    assert (state.head_tree, state.staged_tree, state.work_tree) == (head_tree,) * 3
    assert not state.dirty
    assert await snaps.take(checkout, WS, INC) is None
    assert await snaps.unsaved_files(checkout, state, None) == []
    assert git(checkout, "for-each-ref", "refs/xum").strip() == ""
    # No temporary index left (a clean checkout may need none at all).
    assert not snaps.tmp_dir.exists() or list(snaps.tmp_dir.iterdir()) == []


async def test_a_snapshot_holds_every_kind_of_uncommitted_work_without_writing_the_index(
    tmp_path: Path,
) -> None:
    checkout = repo(tmp_path)
    make_dirty(checkout)
    before = index_digest(checkout)
    staged_before = git(checkout, "diff", "--cached", "--name-only")
    snaps = snapper(tmp_path)

    state = await snaps.capture(checkout)
    assert index_digest(checkout) == before  # the user's index is never written
    # (`git write-tree` stores a cache of trees in the index it reads: our own check, after.)
    assert state.staged_tree == git(checkout, "write-tree").strip()  # the index as staged
    before = index_digest(checkout)
    again = await snaps.capture(checkout)  # the temp directory exists now: reused
    assert again == state
    snap = await snaps.take(checkout, WS, INC)  # no state given: captured here
    assert snap is not None
    assert snap.ref == snapshot_ref(WS, INC) == f"refs/xum/snapshots/{WS}/{INC}"
    assert git(checkout, "rev-parse", snap.ref).strip() == snap.commit
    assert snap.files == DIRTY_FILES
    assert snap.as_dict() == {"ref": snap.ref, "commit": snap.commit, "files": DIRTY_FILES}
    assert git(checkout, "show", f"{snap.commit}:a.txt") == "a changed, unstaged\n"
    assert git(checkout, "show", f"{snap.commit}^2:sub/b.txt") == "b changed, staged\n"
    assert git(checkout, "show", f"{snap.commit}^2:a.txt") == "a\n"  # unstaged: not in I
    listed = git(checkout, "ls-tree", "-r", "--name-only", snap.commit).split()
    assert "x.log" not in listed and "gone.txt" not in listed and "new.txt" in listed
    assert git(checkout, "rev-parse", f"{snap.commit}^1").strip() == state.head
    assert index_digest(checkout) == before
    assert git(checkout, "diff", "--cached", "--name-only") == staged_before
    assert await snaps.holds(checkout, state, snap.commit)
    assert await snaps.unsaved_files(checkout, state, snap.commit) == []
    assert list(snaps.tmp_dir.iterdir()) == []


async def test_a_snapshot_of_a_checkout_without_an_index_file(tmp_path: Path) -> None:
    checkout = repo(tmp_path)
    (checkout / "a.txt").write_text("changed\n")
    (checkout / ".git" / "index").unlink()  # nothing staged at all: everything is deleted
    state = await snapper(tmp_path).capture(checkout)
    assert state.staged_tree == "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # the empty tree
    assert not (checkout / ".git" / "index").exists()
    assert git(checkout, "show", f"{state.work_tree}:a.txt") == "changed\n"


async def test_holds_and_unsaved_files_name_exactly_what_a_snapshot_lacks(
    tmp_path: Path,
) -> None:
    checkout = repo(tmp_path)
    make_dirty(checkout)
    snaps = snapper(tmp_path)
    state = await snaps.capture(checkout)
    assert await snaps.unsaved_files(checkout, state, None) == DIRTY_FILES
    assert not await snaps.holds(checkout, state, None)
    assert not await snaps.holds(checkout, state, "")
    assert not await snaps.holds(checkout, state, "0" * 40)  # no such commit: not held
    head = git(checkout, "rev-parse", "HEAD").strip()
    assert not await snaps.holds(checkout, state, head)  # one parent: not a snapshot
    snap = await snaps.take(checkout, WS, INC, state)
    assert snap is not None and await snaps.holds(checkout, state, snap.commit)

    (checkout / "a.txt").write_text("changed again\n")
    (checkout / "staged.txt").write_text("new, staged\n")
    git(checkout, "add", "staged.txt")
    later = await snaps.capture(checkout)
    assert not await snaps.holds(checkout, later, snap.commit)
    assert await snaps.unsaved_files(checkout, later, snap.commit) == ["a.txt", "staged.txt"]
    # Replayed with the same incarnation: the ref is overwritten, never duplicated.
    again = await snaps.take(checkout, WS, INC, later)
    assert again is not None and again.commit != snap.commit
    assert git(checkout, "for-each-ref", "--format=%(refname)", "refs/xum").split() == [
        snapshot_ref(WS, INC)
    ]


# -- restore ------------------------------------------------------------------------------------


async def test_restore_puts_back_files_index_and_deletions(tmp_path: Path) -> None:
    checkout = repo(tmp_path)
    make_dirty(checkout)
    snap = await snapper(tmp_path).take(checkout, WS, INC)
    assert snap is not None
    git(checkout, "reset", "-q", "--hard")
    git(checkout, "clean", "-q", "-f", "-d")
    assert (checkout / "gone.txt").exists() and (checkout / "sub" / "gone2.txt").exists()

    # A fresh snapshotter (its temp directory not made yet), as after a daemon restart.
    snaps = Snapshotter(Git(), tmp_path / "t2" / "tmp", tmp_path / "a" / "archive")
    files = await snaps.restore(checkout, snap.commit)
    assert files == DIRTY_FILES
    assert (checkout / "a.txt").read_text() == "a changed, unstaged\n"
    assert (checkout / "sub" / "b.txt").read_text() == "b changed, staged\n"
    assert (checkout / "new.txt").read_text() == "untracked\n"
    assert (checkout / "bin.dat").read_bytes() == BINARY
    assert os.readlink(checkout / "link") == "a.txt"
    assert not (checkout / "gone.txt").exists()  # a deletion at the top
    assert not (checkout / "sub" / "gone2.txt").exists()  # and in a directory
    assert git(checkout, "diff", "--cached", "--name-only").split() == [
        "sub/b.txt",
        "sub/gone2.txt",
    ]
    status = git(checkout, "status", "--porcelain=v1", "--untracked-files=all").splitlines()
    assert "?? new.txt" in status and " D gone.txt" in status and " M a.txt" in status
    state = await snaps.capture(checkout)
    assert await snaps.holds(checkout, state, snap.commit)

    # Again, onto the restored checkout (its deleted files already gone): the same result.
    assert await snaps.restore(checkout, snap.commit) == DIRTY_FILES
    assert await snaps.holds(checkout, await snaps.capture(checkout), snap.commit)
    assert list(snaps.tmp_dir.iterdir()) == []


async def test_restore_never_deletes_through_a_symlinked_directory(tmp_path: Path) -> None:
    checkout = repo(tmp_path)
    (checkout / "out" / "f.txt").unlink()  # the snapshot deletes out/f.txt
    snaps = snapper(tmp_path)
    snap = await snaps.take(checkout, WS, INC)
    assert snap is not None and snap.files == ["out/f.txt"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "f.txt").write_text("not the checkout's\n")
    shutil.rmtree(checkout / "out")
    (checkout / "out").symlink_to(elsewhere)
    await snaps.restore(checkout, snap.commit)
    assert (elsewhere / "f.txt").read_text() == "not the checkout's\n"


async def a_changed_snapshot(tmp_path: Path) -> tuple[Path, Snapshot]:
    """A checkout whose `a.txt` changed, and the snapshot that holds the change."""
    checkout = repo(tmp_path)
    (checkout / "a.txt").write_text("changed\n")
    snap = await snapper(tmp_path).take(checkout, WS, INC)
    assert snap is not None
    return checkout, snap


async def test_a_failed_restore_raises_the_git_error_and_leaves_no_temp_index(
    tmp_path: Path,
) -> None:
    checkout, snap = await a_changed_snapshot(tmp_path)
    snaps = snapper(tmp_path, wrapper_git(tmp_path, "read-tree"))
    with pytest.raises(GitError, match="forced failure of read-tree"):
        await snaps.restore(checkout, snap.commit)
    assert list(snaps.tmp_dir.iterdir()) == []


async def test_a_failed_index_refresh_does_not_fail_the_restore(tmp_path: Path) -> None:
    # The refresh only updates stat data (a later `git status` is faster): best effort.
    checkout, snap = await a_changed_snapshot(tmp_path)
    git(checkout, "reset", "-q", "--hard")
    snaps = snapper(tmp_path, wrapper_git(tmp_path, "update-index"))
    assert await snaps.restore(checkout, snap.commit) == ["a.txt"]
    assert (checkout / "a.txt").read_text() == "changed\n"


async def test_a_failed_capture_raises_the_git_error_and_leaves_no_temp_index(
    tmp_path: Path,
) -> None:
    checkout = repo(tmp_path)
    (checkout / "a.txt").write_text("changed\n")
    (checkout / ".git" / "index").unlink()  # no copy made: git is the first to write it
    snaps = snapper(tmp_path, wrapper_git(tmp_path, "write-tree"))
    with pytest.raises(GitError, match="forced failure of write-tree"):
        await snaps.capture(checkout)
    assert list(snaps.tmp_dir.iterdir()) == []


# -- dirty files ----------------------------------------------------------------------------------


async def test_dirty_files_lists_each_path_once_and_never_a_rename_source(
    tmp_path: Path,
) -> None:
    checkout = make_repo(
        tmp_path / "co", {"a": "a\n", "b-old.txt": "rename me\n" * 20, "c.txt": "c\n"}
    )
    (checkout / "a").write_text("one-character name\n")  # " M a": four characters
    git(checkout, "mv", "b-old.txt", "b-new.txt")  # "R  b-new.txt", then "b-old.txt"
    (checkout / "c.txt").write_text("after the rename\n")
    (checkout / "d").write_text("untracked\n")
    files = await snapper(tmp_path).dirty_files(checkout)
    assert files == ["a", "b-new.txt", "c.txt", "d"]


# -- ignored files: report and preserve ------------------------------------------------------------


def ignored_repo(tmp_path: Path) -> Path:
    checkout = make_repo(
        tmp_path / "co",
        {
            "sub/keep.txt": "tracked\n",
            ".gitignore": "*.log\n*.key\nbuild/\ncache/\n.env\n",
        },
    )
    (checkout / "top.log").write_text("12345")
    (checkout / "build" / "deep").mkdir(parents=True)
    (checkout / "build" / "out.o").write_text("0123456789")
    (checkout / "build" / "deep" / "x.o").write_text("abc")
    (checkout / "cache").mkdir()  # an ignored empty directory
    (checkout / ".env").write_text("API_KEY=top\n")
    (checkout / "sub" / ".env").write_text("API_KEY=sub\n")
    (checkout / "sub" / "a.key").write_text("KEY\n")
    os.mkfifo(checkout / "pipe")
    os.mkfifo(checkout / ".git" / "not-the-checkouts")
    return checkout


async def test_report_and_preserve_counts_dropped_and_keeps_preserved(tmp_path: Path) -> None:
    checkout = ignored_repo(tmp_path)
    snaps = snapper(tmp_path)
    assert await snaps.preserved_in(checkout, []) == []
    assert snaps.preserved_files(checkout, [".env"], []) == []
    assert await snaps.preserved_in(checkout, [".env", "*.key"]) == [
        ".env",
        "sub/.env",
        "sub/a.key",
    ]

    dropped = await snaps.report_and_preserve(checkout, WS, INC, [".env", "*.key"])
    assert (dropped.count, dropped.bytes) == (3, 18)  # top.log, build/out.o, build/deep/x.o
    assert dropped.preserved == [".env", "sub/.env", "sub/a.key"]
    # `.env` and `sub/` hold only preserved files: not lost; the empty `cache/` is.
    assert sorted(dropped.paths) == ["build/", "cache/", "top.log"]
    assert dropped.special == [{"path": "pipe", "type": "fifo"}]  # never one inside .git
    store = snaps.archive_dir / WS
    assert (store / "files" / ".env").read_text() == "API_KEY=top\n"
    assert (store / "files" / "sub" / ".env").read_text() == "API_KEY=sub\n"
    assert (store / "files" / "sub" / "a.key").read_text() == "KEY\n"
    manifest = json.loads((store / "manifest.json").read_text())
    assert manifest == {
        "workspace_id": WS,
        "incarnation": INC,
        "files": [".env", "sub/.env", "sub/a.key"],
    }
    assert sorted(p.name for p in snaps.archive_dir.iterdir()) == [WS]  # no temp copy left

    # A replay of the same save (the store exists): replaced, the same result.
    (checkout / ".env").write_text("API_KEY=top, later\n")
    again = await snaps.report_and_preserve(checkout, WS, INC, [".env", "*.key"])
    assert again.as_dict() == dropped.as_dict()
    assert (store / "files" / ".env").read_text() == "API_KEY=top, later\n"
    assert sorted(p.name for p in snaps.archive_dir.iterdir()) == [WS]


async def test_nothing_preserved_without_a_matching_glob(tmp_path: Path) -> None:
    checkout = ignored_repo(tmp_path)
    snaps = snapper(tmp_path)
    dropped = await snaps.report_and_preserve(checkout, WS, INC, ["sub/*.none"])
    assert dropped.preserved == []
    assert (dropped.count, dropped.bytes) == (6, 18 + 12 + 12 + 4)
    assert not (snaps.archive_dir / WS).exists()
    none = await snaps.report_and_preserve(checkout, WS, INC, [])
    assert none.as_dict() == dropped.as_dict()


def test_a_glob_with_a_slash_matches_the_path_only(tmp_path: Path) -> None:
    checkout = ignored_repo(tmp_path)
    snaps = snapper(tmp_path)
    entries = [".env", "sub/.env", "sub/a.key", "top.log"]
    assert snaps.preserved_files(checkout, entries, ["sub/*"]) == ["sub/.env", "sub/a.key"]
    assert snaps.preserved_files(checkout, entries, ["*/.env"]) == ["sub/.env"]
    assert snaps.preserved_files(checkout, entries, ["top.log"]) == ["top.log"]


def test_top_paths_and_specials_are_bounded(tmp_path: Path) -> None:
    checkout = make_repo(tmp_path / "co")
    entries = []
    for i in range(55):
        (checkout / f"f{i:02}.log").write_text("x")
        entries.append(f"f{i:02}.log")
    fifos = checkout / "fifos"
    fifos.mkdir()
    for i in range(1001):
        os.mkfifo(fifos / f"p{i}")
    dropped = snapper(tmp_path)._report_and_preserve(checkout, WS, INC, entries, [])
    assert (dropped.count, dropped.bytes) == (55, 55)
    assert dropped.paths == entries[:50]
    assert len(dropped.special) == 1001
    # The reply names the first thousand (a literal: the module's constant is what is tested).
    assert MAX_SPECIAL == 1000
    assert len(dropped.as_dict()["special"]) == 1000  # type: ignore[arg-type]


def test_a_file_listed_twice_counts_once_and_the_walk_goes_on(tmp_path: Path) -> None:
    # git may list a directory and a file in it: `d/a` then `d/`, whose walk (in name order)
    # meets `a` again first and `d/s/z` after it.
    checkout = make_repo(tmp_path / "co")
    (checkout / "d" / "s").mkdir(parents=True)
    (checkout / "d" / "a").write_text("aa")
    (checkout / "d" / "s" / "z").write_text("zzz")
    assert fscopy.files_within(checkout / "d") == [("a", 2), ("s/z", 3)]
    dropped = snapper(tmp_path)._report_and_preserve(checkout, WS, INC, ["d/a", "d/"], [])
    assert (dropped.count, dropped.bytes) == (2, 5)
    assert dropped.paths == ["d/"]
    assert Dropped().as_dict() == {
        "count": 0,
        "bytes": 0,
        "paths": [],
        "preserved": [],
        "special": [],
    }


def test_entries_gone_or_special_are_not_counted_and_paths_past_path_max_are(
    tmp_path: Path,
) -> None:
    checkout = make_repo(tmp_path / "co")
    os.mkfifo(checkout / "p")
    # A directory whose path fits PATH_MAX (4096) while the long names in it do not: a walk by
    # path could not `lstat` those files (ENAMETOOLONG) nor list the directory below them, and
    # under-counted `dropped`. The walk by descriptor counts them with their siblings.
    # About 3,950 bytes whatever the temporary directory's own length (a CI clone's is longer):
    # the 241-byte names below then pass PATH_MAX, the directory and its short names do not.
    deep = checkout / "deep"
    while len(str(deep)) < 3950:
        deep = deep / ("d" * max(1, min(200, 3950 - len(str(deep)) - 1)))
    assert len(str(deep)) + 1 + 241 > 4095 > len(str(deep)) + 4
    deep.mkdir(parents=True)
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(5):
            long_fd = os.open(f"{i}" + "L" * 240, os.O_CREAT | os.O_WRONLY, dir_fd=fd)
            os.write(long_fd, b"LL")
            os.close(long_fd)
        os.mkdir("D" * 250, dir_fd=fd)
        below = os.open("D" * 250, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        try:
            os.close(os.open("x" * 250, os.O_CREAT | os.O_WRONLY, dir_fd=below))
        finally:
            os.close(below)
    finally:
        os.close(fd)
    for i in range(20):
        (deep / f"s{i}").write_text("s")
    dropped = snapper(tmp_path)._report_and_preserve(
        checkout, WS, INC, ["missing", "missing-dir/", "p", "deep/"], []
    )
    assert (dropped.count, dropped.bytes) == (20 + 5 + 1, 20 + 5 * 2)
    assert {s["path"] for s in dropped.special} == {"p"}
    assert stat.S_ISFIFO(os.lstat(checkout / "p").st_mode)


def test_files_within_skips_what_it_cannot_read() -> None:
    """A usage walk: a directory that cannot be listed is skipped (its siblings still counted),
    and a top that is gone or not a directory is an empty answer, never an error."""
    top = short_tmpdir()  # (pytest's tmp_path is 0700: `nobody` could not enter it)
    top.chmod(0o755)
    (top / "closed").mkdir()
    (top / "closed" / "hidden").write_text("h")
    (top / "open").mkdir()
    (top / "open" / "seen").write_text("seen")
    os.symlink("open", top / "link")
    os.chmod(top / "closed", 0)
    try:
        # (root would list a mode-000 directory: the walk runs as another user)
        found = as_nobody(lambda: fscopy.files_within(top))
        unlistable_top = as_nobody(lambda: fscopy.files_within(top / "closed"))
    finally:
        os.chmod(top / "closed", 0o755)
    assert sorted(found) == [("link", 4), ("open/seen", 4)]
    assert unlistable_top == []  # a top it may not read: nothing to count, not an error
    assert fscopy.files_within(top / "gone") == []
    assert fscopy.files_within(top / "open" / "seen") == []


# -- a full archive filesystem ---------------------------------------------------------------


async def test_a_copy_that_runs_out_of_inodes_fails_and_leaves_nothing(tmp_path: Path) -> None:
    checkout = ignored_repo(tmp_path)
    with tmpfs(tmp_path / "arch", "size=4m,nr_inodes=3") as mount:
        # Room for the one file the up-front check counts, not for the copy's directories.
        snaps = Snapshotter(Git(), tmp_path / "tmp", mount)
        with pytest.raises(XumError) as raised:
            await snaps.report_and_preserve(checkout, WS, INC, [".env"])
        assert raised.value.kind == ErrorKind.DISK_FULL
        assert list(mount.iterdir()) == []  # the half copy is rolled back


async def test_a_copy_that_does_not_fit_is_refused_before_writing(tmp_path: Path) -> None:
    checkout = ignored_repo(tmp_path)
    (checkout / ".env").write_bytes(os.urandom(3 << 20))
    with tmpfs(tmp_path / "arch", "size=2m") as mount:
        snaps = Snapshotter(Git(), tmp_path / "tmp", mount)
        with pytest.raises(XumError) as raised:
            await snaps.report_and_preserve(checkout, WS, INC, [".env"])
        assert raised.value.kind == ErrorKind.DISK_FULL
        assert list(mount.iterdir()) == []


# -- restore of preserved files -------------------------------------------------------------------


def test_restore_preserved_puts_back_only_what_is_safe(tmp_path: Path) -> None:
    snaps = snapper(tmp_path)
    checkout = make_repo(tmp_path / "co")
    assert snaps.restore_preserved(WS, checkout) == []  # no copy at all
    store = snaps.archive_dir / WS
    files = store / "files"
    (files / "esc").mkdir(parents=True)
    (files / "esc" / "f").write_text("would go outside\n")
    (files / "exists.env").write_text("saved\n")
    (files / "deep" / "er").mkdir(parents=True)
    (files / "deep" / "er" / ".env").write_text("deep\n")
    (files / "deep" / "er" / "b.env").write_text("b\n")
    (files / "dangling").symlink_to("nowhere")
    (store / "manifest.json").write_text("{not json")
    assert snaps.restore_preserved(WS, checkout) == []  # an unreadable manifest: nothing
    manifest = ["esc/f", "missing.env", "exists.env", "dlink", "dangling"]
    manifest += ["deep/er/.env", "deep/er/b.env"]
    (store / "manifest.json").write_text(json.dumps({"files": manifest}))
    outside = tmp_path / "outside"
    outside.mkdir()
    (checkout / "esc").symlink_to(outside)
    (checkout / "exists.env").write_text("the new checkout's\n")
    (checkout / "dlink").symlink_to("nowhere-either")
    (files / "dlink").write_text("saved\n")

    assert snaps.restore_preserved(WS, checkout) == ["dangling", "deep/er/.env", "deep/er/b.env"]
    assert list(outside.iterdir()) == []  # never written through a symlinked directory
    assert (checkout / "exists.env").read_text() == "the new checkout's\n"
    assert os.readlink(checkout / "dlink") == "nowhere-either"
    assert os.readlink(checkout / "dangling") == "nowhere"
    assert (checkout / "deep" / "er" / ".env").read_text() == "deep\n"
    assert (checkout / "deep" / "er" / "b.env").read_text() == "b\n"


def test_an_index_that_is_a_fifo_never_blocks_the_capture(tmp_path: Path) -> None:
    """`.git/index` replaced by a named pipe (a hostile or broken checkout): the capture's look
    at the index header must not block on it (an `open` for reading waits for a writer, in the
    event loop's thread: the whole daemon would hang). It fails with an error instead, as the
    full path's copy of the index always did. In a child process, bounded: a hang is a
    failure, not a stuck suite."""
    checkout = repo(tmp_path)
    (checkout / ".git" / "index").unlink()
    os.mkfifo(checkout / ".git" / "index")
    probe = (
        "import anyio, sys\n"
        "from pathlib import Path\n"
        "from xumd.system.git import Git\n"
        "from xumd.lifecycle.snapshot import Snapshotter\n"
        "base = Path(sys.argv[2])\n"
        "snaps = Snapshotter(Git(), base / 'tmp', base / 'archive')\n"
        "try:\n"
        "    anyio.run(lambda: snaps.capture(Path(sys.argv[1])))\n"
        "except OSError as exc:\n"
        "    print('refused:', type(exc).__name__)\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe, str(checkout), str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the capture blocked on an index that is a FIFO")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused: "), done.stdout


# -- refusals: a conflict, an operation in progress; a HEAD no ref holds -------------------------


def conflicted(tmp_path: Path, names: list[str]) -> Path:
    """A checkout stopped in a merge whose every file in `names` conflicts."""
    checkout = make_repo(tmp_path / "co", {n: "base\n" for n in names})
    git(checkout, "checkout", "-q", "-b", "other")
    for n in names:
        (checkout / n).write_text("theirs\n")
    git(checkout, "commit", "-q", "-a", "-m", "theirs")
    git(checkout, "checkout", "-q", "main")
    for n in names:
        (checkout / n).write_text("ours\n")
    git(checkout, "commit", "-q", "-a", "-m", "ours")
    git(checkout, "merge", "-q", "other", check=False)
    return checkout


@pytest.mark.parametrize(("count", "more"), [(5, ""), (6, " and 1 more"), (101, " and 96 more")])
async def test_a_conflict_is_refused_naming_its_first_unmerged_paths(
    tmp_path: Path, count: int, more: str
) -> None:
    # A name with a tab: `ls-files -u -z` prints it as it is, after the tab that ends the stage.
    names = sorted([f"f{i:03}" for i in range(count - 1)] + ["tab\there"])
    checkout = conflicted(tmp_path, names)
    snaps = snapper(tmp_path)
    with pytest.raises(XumError) as refused:
        await snaps.capture(checkout)
    assert refused.value.kind == ErrorKind.NOT_SAFE
    assert refused.value.message == (
        f"the checkout at {checkout} has unmerged paths ({', '.join(names[:5])}{more}): "
        "resolve them (git add) or abort first; a conflict cannot be snapshotted"
    )
    # Each path once (git lists three stages of it); the reply names the first hundred.
    assert refused.value.data["files"] == names[:100]
    assert refused.value.data["path"] == str(checkout)
    assert list(snaps.tmp_dir.iterdir()) == []


async def test_a_failed_capture_whose_conflict_listing_fails_too_raises_the_capture_error(
    tmp_path: Path,
) -> None:
    checkout = repo(tmp_path)
    (checkout / "a.txt").write_text("changed\n")
    snaps = snapper(tmp_path, wrapper_git(tmp_path, "write-tree", "ls-files"))
    with pytest.raises(GitError, match="forced failure of write-tree"):
        await snaps.capture(checkout)


async def test_a_listing_that_fails_names_its_git_command(tmp_path: Path) -> None:
    checkout = repo(tmp_path)
    with pytest.raises(XumError) as failed:
        await snapper(tmp_path).changed_paths(checkout, "0" * 40, "HEAD")
    assert failed.value.message.startswith("listing git diff-tree failed: git diff-tree: ")


async def test_nothing_in_progress_is_not_refused(tmp_path: Path) -> None:
    checkout = repo(tmp_path)
    make_dirty(checkout)
    await snapper(tmp_path).refuse_in_progress(checkout, "ws", "archive")


async def test_a_merge_in_progress_is_refused_by_name(tmp_path: Path) -> None:
    checkout = conflicted(tmp_path, ["f"])
    with pytest.raises(XumError) as refused:
        await snapper(tmp_path).refuse_in_progress(checkout, "ws", "archive")
    assert refused.value.kind == ErrorKind.NOT_SAFE
    assert refused.value.message == (
        "cannot archive 'ws': a merge is in progress in its checkout; finish or abort it first "
        "(its state would go with the checkout)"
    )
    assert refused.value.data == {"in_progress": ["a merge"], "path": str(checkout)}


async def test_a_cherry_pick_sequence_is_refused_naming_the_first_operation(
    tmp_path: Path,
) -> None:
    checkout = make_repo(tmp_path / "co", {"f": "base\n"})
    git(checkout, "checkout", "-q", "-b", "other")
    (checkout / "f").write_text("theirs\n")
    git(checkout, "commit", "-q", "-a", "-m", "theirs")
    (checkout / "g").write_text("g\n")
    git(checkout, "add", "g")
    git(checkout, "commit", "-q", "-m", "g")
    git(checkout, "checkout", "-q", "main")
    (checkout / "f").write_text("ours\n")
    git(checkout, "commit", "-q", "-a", "-m", "ours")
    # Two commits: git stops at the first (a conflict), its sequence still to run.
    git(checkout, "cherry-pick", "other~1", "other", check=False)
    with pytest.raises(XumError) as refused:
        await snapper(tmp_path).refuse_in_progress(checkout, "ws", "remove")
    assert refused.value.message.startswith(
        "cannot remove 'ws': a cherry-pick is in progress in its checkout;"
    )
    assert refused.value.data["in_progress"] == [
        "a cherry-pick",
        "a cherry-pick or revert sequence",
    ]


async def test_a_head_on_a_branch_is_held_without_asking_which_refs_contain_it(
    tmp_path: Path,
) -> None:
    checkout = repo(tmp_path)
    head = git(checkout, "rev-parse", "HEAD").strip()
    # A failing for-each-ref: the branch alone answers.
    assert await snapper(tmp_path, wrapper_git(tmp_path, "for-each-ref")).head_held(checkout, head)


async def test_a_detached_head_is_held_only_by_a_ref_that_contains_it(tmp_path: Path) -> None:
    checkout = repo(tmp_path)
    snaps = snapper(tmp_path)
    git(checkout, "checkout", "-q", "--detach")
    (checkout / "a.txt").write_text("on a detached HEAD\n")
    git(checkout, "commit", "-q", "-a", "-m", "detached")
    head = git(checkout, "rev-parse", "HEAD").strip()
    assert not await snaps.head_held(checkout, head)
    git(checkout, "tag", "kept")
    assert await snaps.head_held(checkout, head)
    git(checkout, "tag", "-d", "kept")
    # HEAD may name a ref outside refs/heads (tools write their own): not a branch, so only
    # a branch, tag or remote-tracking ref that contains the commit holds it.
    git(checkout, "update-ref", "refs/xum/elsewhere", head)
    git(checkout, "symbolic-ref", "HEAD", "refs/xum/elsewhere")
    assert not await snaps.head_held(checkout, head)


# -- the raw copy and the index flags --------------------------------------------------------------


async def proved(snaps: Snapshotter, checkout: Path) -> onbytes.Account:
    state = await snaps.capture(checkout)
    return await snaps.prove(checkout, state.work_tree, None)


async def test_raw_entries_are_saved_in_a_private_copy_and_placed_back(tmp_path: Path) -> None:
    checkout = repo(tmp_path)
    (checkout / "empty").mkdir()  # no snapshot holds an empty directory: a raw entry
    (checkout / "deep" / "er").mkdir(parents=True)
    (checkout / "deep" / "er" / "keep.log").write_text("kept\n")
    snaps = snapper(tmp_path)
    proof = await proved(snaps, checkout)
    assert [(e.path, e.why) for e in proof.raw] == [("empty", "empty_directory")]
    assert proof.flags == {}

    dropped = await snaps.report_and_preserve(checkout, WS, INC, ["keep.log"], proof=proof)
    assert dropped.preserved == ["deep/er/keep.log"]
    store = snaps.archive_dir / WS
    assert stat.S_IMODE(store.stat().st_mode) == 0o700  # the user's files: theirs alone
    assert (store / "files" / "deep" / "er" / "keep.log").read_text() == "kept\n"
    assert (store / "raw" / "empty").is_dir()
    manifest = json.loads((store / "manifest.json").read_text())
    assert manifest["raw"] == [{"path": "empty", "why": "empty_directory"}]
    assert "flags" not in manifest

    restored = make_repo(tmp_path / "restored")
    placed = snaps.restore_raw(WS, restored)
    assert (placed.placed, placed.problems) == (["empty"], [])
    assert (restored / "empty").is_dir()
    nothing = snaps.restore_raw("ws-without-a-copy", restored)
    assert (nothing.placed, nothing.problems) == ([], [])


async def test_a_raw_entry_alone_is_saved(tmp_path: Path) -> None:
    checkout = repo(tmp_path)
    (checkout / "empty").mkdir()
    snaps = snapper(tmp_path)
    dropped = await snaps.report_and_preserve(
        checkout, WS, INC, [], proof=await proved(snaps, checkout)
    )
    assert dropped.preserved == []
    assert (snaps.archive_dir / WS / "raw" / "empty").is_dir()


async def test_index_flags_alone_are_saved(tmp_path: Path) -> None:
    checkout = repo(tmp_path)
    git(checkout, "update-index", "--assume-unchanged", "a.txt")
    snaps = snapper(tmp_path)
    proof = await proved(snaps, checkout)
    assert (proof.raw, proof.flags) == ([], {"a.txt": "assume_unchanged"})
    await snaps.report_and_preserve(checkout, WS, INC, [], proof=proof)
    store = snaps.archive_dir / WS
    assert json.loads((store / "manifest.json").read_text()) == {
        "workspace_id": WS,
        "incarnation": INC,
        "files": [],
        "flags": {"a.txt": "assume_unchanged"},
    }
    # A copy without raw entries: nothing to place.
    placed = snaps.restore_raw(WS, make_repo(tmp_path / "restored"))
    assert (placed.placed, placed.problems) == ([], [])


async def test_the_report_speaks_of_the_listing_the_proof_was_made_against(
    tmp_path: Path,
) -> None:
    checkout = repo(tmp_path)
    (checkout / "early.log").write_text("12")
    snaps = snapper(tmp_path)
    proof = await proved(snaps, checkout)
    assert proof.ignored == ["early.log"]
    (checkout / "late.log").write_text("12345")  # after the proof: not in its listing
    dropped = await snaps.report_and_preserve(checkout, WS, INC, [], proof=proof)
    assert (dropped.count, dropped.bytes, dropped.paths) == (1, 2, ["early.log"])
