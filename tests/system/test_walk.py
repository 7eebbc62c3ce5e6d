"""The one tree walk by descriptor (system/walk.py), on real trees: deeper than PATH_MAX and
than its descriptor window, a directory swapped for a link between its lstat and its open, an
ancestor moved away, special files that would block or never end if opened, symlink loops, a
directory it may not read (as another user), and real tmpfs and bind mounts (root only)."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from xumd.system import walk

from tests.support.daemon import short_tmpdir
from tests.support.mounts import Mounts, real_mounts
from tests.support.otheruser import as_nobody

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_MAX = os.pathconf("/", "PC_PATH_MAX")


def _steps(top: Path, policy: walk.Policy | None = None) -> list[tuple[str, str]]:
    """(kind, relative path) of every step of a walk of `top`."""
    fd = os.open(top, _DIR)
    try:
        return [(step.kind, step.rel) for step in walk.Walk(fd, policy)]
    finally:
        os.close(fd)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def mounts(tmp_short: Path) -> Iterator[Mounts]:
    with real_mounts(tmp_short) as m:
        yield m


def test_a_tree_deeper_than_path_max_and_than_the_window(tmp_short: Path) -> None:
    """Every entry of a chain of directories whose full path is longer than PATH_MAX and whose
    depth is past the descriptor window is walked, with its relative path; the way back up
    reopens the closed ancestors through `..`; no descriptor is left open."""
    name = "d" * 60
    depth = walk.WINDOW + 20
    assert depth * (len(name) + 1) > _PATH_MAX  # no absolute path to the bottom can be opened
    fd = os.open(tmp_short, _DIR)
    for _ in range(depth):
        os.mkdir(name, dir_fd=fd)
        sub = os.open(name, _DIR, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644, dir_fd=fd))
    os.close(fd)
    before = _open_fds()
    steps = _steps(tmp_short, walk.Policy(leave=True))
    chain = "/".join([name] * depth)
    assert ("entry", f"{chain}/leaf") in steps
    assert [rel for kind, rel in steps if kind == "entry"][:2] == [name, f"{name}/{name}"]
    # Post-order: each directory is left after what it holds, the deepest first.
    leaves = [rel for kind, rel in steps if kind == "leave"]
    assert leaves[0] == chain and leaves[-1] == name and len(leaves) == depth
    assert _open_fds() == before


def test_an_ancestor_moved_away_stops_the_walk(tmp_short: Path) -> None:
    """An ancestor past the window is moved out of the tree while the walk is below it: the
    way back up through `..` would lead into its new parent, so the walk says `Moved` (raised,
    or handed to the caller's `errors` with the ancestor's path) and walks nothing more."""
    top = tmp_short / "top"
    deep = top.joinpath(*["d"] * (walk.WINDOW + 3))
    deep.mkdir(parents=True)
    (top / "z-after").mkdir()  # listed after `d` (name order): never reached
    elsewhere = tmp_short / "elsewhere"
    elsewhere.mkdir()

    def run(policy: walk.Policy) -> list[str]:
        fd = os.open(top, _DIR)
        seen = []
        try:
            for step in walk.Walk(fd, policy):
                seen.append(step.rel)
                if step.rel.count("/") == walk.WINDOW + 2:  # the bottom: move `d/d` away
                    os.rename(top / "d" / "d", elsewhere / "d")
        finally:
            os.close(fd)
        return seen

    with pytest.raises(walk.Moved):
        run(walk.Policy())
    os.rename(elsewhere / "d", top / "d" / "d")
    said: list[tuple[str, OSError]] = []
    seen = run(walk.Policy(errors=lambda rel, exc: said.append((rel, exc))))
    assert "z-after" not in seen
    assert len(said) == 1 and isinstance(said[0][1], walk.Moved)
    # `d/d` moved whole: its child's `..` is still `d/d`; its own `..` is no longer `d`.
    assert said[0][0] == "d"


def test_a_directory_swapped_for_a_link_is_never_followed(tmp_short: Path) -> None:
    """Between the walk's lstat of `a` (a directory) and its open, `a` becomes a symlink to a
    directory outside the tree: the open refuses it (O_NOFOLLOW), the walk looks again and
    hands `a` over as the link it now is; nothing outside is walked."""
    top = tmp_short / "top"
    (top / "a").mkdir(parents=True)
    outside = tmp_short / "outside"
    outside.mkdir()
    (outside / "secret").write_text("not the tree's")

    def swap_then_open(name: str, dir_fd: int) -> int:
        if name == "a" and not (tmp_short / "moved-a").exists():
            os.rename(top / "a", tmp_short / "moved-a")
            os.symlink(outside, top / "a")
        return walk.open_dir(name, dir_fd)

    fd = os.open(top, _DIR)
    try:
        steps = list(walk.Walk(fd, walk.Policy(open=swap_then_open)))
        assert [(s.rel, s.fd is None, s.is_symlink()) for s in steps] == [("a", True, True)]
    finally:
        os.close(fd)


def test_special_files_are_handed_over_never_opened(tmp_short: Path) -> None:
    """A FIFO (an open would block), a socket, a character device (/dev/zero's numbers: a read
    never ends): each is an entry like any other, with its type, never opened; the walk ends.
    With `files` off they are in the directory's listing only."""
    top = tmp_short / "top"
    top.mkdir()
    (top / "file").write_text("f")
    os.mkfifo(top / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(top / "sock"))
    try:
        try:
            os.mknod(top / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))
        except PermissionError:
            pytest.skip("making a device node needs CAP_MKNOD")
        fd = os.open(top, _DIR)
        try:
            kinds = {s.rel: stat.S_IFMT(s.lstat().st_mode) for s in walk.Walk(fd)}
            listed = [
                (s.kind, sorted(e.name for e in s.entries))
                for s in walk.Walk(fd, walk.Policy(stat=False, files=False, listings=True))
            ]
        finally:
            os.close(fd)
    finally:
        sock.close()
    assert kinds == {
        "file": stat.S_IFREG,
        "fifo": stat.S_IFIFO,
        "sock": stat.S_IFSOCK,
        "zero": stat.S_IFCHR,
    }
    # Without a step per file, they are the listing's to read.
    assert listed == [(walk.LISTED, ["fifo", "file", "sock", "zero"])]


def test_symlink_loops_are_entries_never_followed(tmp_short: Path) -> None:
    top = tmp_short / "top"
    (top / "sub").mkdir(parents=True)
    os.symlink("b", top / "a")
    os.symlink("a", top / "b")
    os.symlink("..", top / "sub" / "up")
    os.symlink(top, top / "sub" / "self")
    assert _steps(top) == [
        ("entry", "a"),
        ("entry", "b"),
        ("entry", "sub"),
        ("entry", "sub/self"),
        ("entry", "sub/up"),
    ]


def test_an_unreadable_directory_is_named_or_reported() -> None:
    """As another user (root reads a mode-000 directory): a directory that cannot be opened
    raises naming its path relative to the top (with the caller's prefix); with `errors` it is
    handed over and its siblings are still walked."""
    top = short_tmpdir()
    top.chmod(0o755)
    try:
        (top / "a" / "closed").mkdir(parents=True)
        (top / "a" / "closed" / "hidden").write_text("h")
        (top / "b").mkdir()
        (top / "b" / "seen").write_text("s")
        os.chmod(top / "a" / "closed", 0)

        def raised() -> tuple[str, int]:
            try:
                _steps(top, walk.Policy(prefix="work/"))
            except PermissionError as exc:
                return str(exc.filename), exc.errno or 0
            return "", 0

        def reported() -> tuple[list[tuple[str, str]], list[str]]:
            said: list[str] = []
            steps = _steps(top, walk.Policy(errors=lambda rel, exc: said.append(rel)))
            return steps, said

        assert as_nobody(raised) == ("work/a/closed", 13)
        steps, said = as_nobody(reported)
        assert said == ["a/closed"]
        assert ("entry", "b/seen") in steps
        assert not any(rel.startswith("a/closed") for _kind, rel in steps)
    finally:
        os.chmod(top / "a" / "closed", 0o755)


@pytest.mark.parametrize("platform_ids", [True, False], ids=["mount_ids", "no_mount_ids"])
def test_a_bind_mount_made_mid_walk_is_not_entered(
    tmp_short: Path, mounts: Mounts, monkeypatch: pytest.MonkeyPatch, platform_ids: bool
) -> None:
    """A bind mount of the same filesystem made after its parent was listed and before the walk
    opens it is a MOUNT step, for a caller whose mount table showed no mount below the top
    (`mount_ids=False`: no mount id read per directory) and where the platform has no mount
    ids at all (the portable backend; here Linux's read made to answer none): the parent's
    listing names the covered directory's inode, the open reaches the mount's root. What is
    under it is never walked (a deletion would have emptied another tree)."""
    if not platform_ids:
        monkeypatch.setattr(walk, "mount_id", lambda fd: None)
    top = tmp_short / "top"
    inner = top / "keep" / "mnt"
    inner.mkdir(parents=True)
    (top / "keep" / "own").write_text("o")
    other = tmp_short / "other"
    other.mkdir()
    (other / "theirs").write_text("t")
    fd = os.open(top, _DIR)
    steps: list[tuple[str, str]] = []
    try:
        for step in walk.Walk(fd, walk.Policy(listings=True, mount_ids=False)):
            steps.append((step.kind, step.rel))
            if step.kind == walk.LISTED and step.rel == "keep":
                mounts.bind(other, inner)  # listed, not yet opened
    finally:
        os.close(fd)
    assert ("mount", "keep/mnt") in steps
    assert not any(rel.startswith("keep/mnt/") for _kind, rel in steps)
    assert ("entry", "keep/own") in steps


@pytest.mark.parametrize("kind", ["tmpfs", "bind"])
def test_a_mount_is_never_entered(tmp_short: Path, mounts: Mounts, kind: str) -> None:
    """A tmpfs (another st_dev) or a bind mount of the same filesystem (same st_dev, another
    mount id) below the top is a MOUNT step, not entered, and the directories above it say
    `held` when left. Without a mount id read per directory (a caller whose table shows no
    mount below) the bind mount is told by its listing's inode."""
    top = tmp_short / "top"
    inner = top / "keep" / "mnt"
    inner.mkdir(parents=True)
    (top / "keep" / "own").write_text("o")
    if kind == "tmpfs":
        mounts.tmpfs(inner)
    else:
        other = tmp_short / "other"
        other.mkdir()
        mounts.bind(other, inner)
    (inner / "theirs").write_text("t")
    fd = os.open(top, _DIR)
    try:
        steps = [
            (s.kind, s.rel, s.held if s.kind == walk.LEAVE else None)
            for s in walk.Walk(fd, walk.Policy(leave=True))
            if s.kind != walk.ENTRY
        ]
        by_dev = _steps(top, walk.Policy(mount_ids=False))
    finally:
        os.close(fd)
    assert steps == [("mount", "keep/mnt", None), ("leave", "keep", True)]
    assert ("mount", "keep/mnt") in by_dev
    assert ("entry", "keep/mnt/theirs") not in by_dev


def test_listing_inodes_that_differ_on_one_mount_are_walked(
    tmp_short: Path, mounts: Mounts
) -> None:
    """overlayfs without `xino`, its layers on two filesystems, lists every directory by
    another inode than its stat gives: the mount ids say it is one mount, and the walk goes
    through it whole (nothing taken for a mount, nothing left undeleted)."""
    (tmp_short / "lower").mkdir()
    lower = mounts.tmpfs(tmp_short / "lower")
    (lower / "d" / "sub").mkdir(parents=True)
    (lower / "d" / "sub" / "f").write_text("x")
    merged = tmp_short / "merged"
    merged.mkdir()
    mounts.overlay(lower, tmp_short / "scratch", merged, "xino=off")
    listed = {e.name: e.inode() for e in os.scandir(merged)}
    if listed["d"] == os.stat(merged / "d").st_ino:
        pytest.skip("this kernel's overlayfs lists directories by their stat inode")
    for policy in (walk.Policy(), walk.Policy(mount_ids=False)):
        assert _steps(merged, policy) == [
            ("entry", "d"),
            ("entry", "d/sub"),
            ("entry", "d/sub/f"),
        ]


def test_a_directory_its_opener_refuses_as_another_mount_is_a_mount_step_and_held(
    tmp_short: Path,
) -> None:
    """A caller's opener that refuses a directory as the root of another mount
    (`walk.OtherMount`: the deletion's, from its mount table) makes it a MOUNT step, not
    entered, and the directories above it say `held` when left; a sibling is walked."""
    top = tmp_short / "top"
    (top / "keep" / "mnt").mkdir(parents=True)
    (top / "keep" / "mnt" / "theirs").write_text("t")
    (top / "keep" / "own").mkdir()

    def opener(name: str, dir_fd: int) -> int:
        if name == "mnt":
            raise walk.OtherMount
        return walk.open_dir(name, dir_fd)

    fd = os.open(top, _DIR)
    try:
        steps = [
            (s.kind, s.rel, s.held if s.kind == walk.LEAVE else None)
            for s in walk.Walk(fd, walk.Policy(leave=True, open=opener))
        ]
    finally:
        os.close(fd)
    assert steps == [
        ("entry", "keep", None),
        ("mount", "keep/mnt", None),
        ("entry", "keep/own", None),
        ("leave", "keep/own", False),
        ("leave", "keep", True),
    ]


def test_a_bind_mount_looked_at_again_by_name_is_told_by_its_mount_id(
    tmp_short: Path, mounts: Mounts
) -> None:
    """An entry handed back by name (`again`: no listing entry, so no listing inode to compare)
    that is a bind mount of the same filesystem is told by its mount id: a MOUNT step again,
    never entered."""
    top = tmp_short / "top"
    inner = top / "keep" / "mnt"
    inner.mkdir(parents=True)
    (top / "keep" / "a").write_text("a")
    other = tmp_short / "other"
    other.mkdir()
    mounts.bind(other, inner)
    (inner / "theirs").write_text("t")
    fd = os.open(top, _DIR)
    steps: list[tuple[str, str]] = []
    try:
        w = walk.Walk(fd)
        for step in w:
            steps.append((step.kind, step.rel))
            if step.rel == "keep/a":
                w.again("mnt")
    finally:
        os.close(fd)
    assert steps.count(("mount", "keep/mnt")) == 2
    assert ("entry", "keep/mnt/theirs") not in steps


def test_links_are_told_from_what_they_point_to_by_the_listing_and_the_order_holds(
    tmp_short: Path,
) -> None:
    """With the listing's entry types answering (`stat=False`), a link to a directory or a file
    is a link, never a directory or a file, and its `lstat` is the link's; a directory's own
    entries come right after it (name order), or after its files, links and special files with
    `files_first`, where a link to a directory counts with the files."""
    top = tmp_short / "top"
    (top / "d").mkdir(parents=True)
    (top / "d" / "x").write_text("x")
    (top / "f").write_text("f")
    os.symlink("d", top / "ld")
    os.symlink("f", top / "lf")
    fd = os.open(top, _DIR)
    try:
        kinds = {
            s.rel: (s.is_dir(), s.is_file(), s.is_symlink(), stat.S_ISLNK(s.lstat().st_mode))
            for s in walk.Walk(fd, walk.Policy(stat=False))
            if s.kind == walk.ENTRY
        }
        # A LEAVE step has neither a listing entry nor an lstat: it is looked up by name (each
        # question asked first in a walk of its own: the first answer keeps the lstat).
        leaves = {
            question: [
                answer(s)
                for s in walk.Walk(fd, walk.Policy(stat=False, leave=True))
                if s.kind == walk.LEAVE
            ]
            for question, answer in {
                "is_dir": walk.Step.is_dir,
                "is_file": walk.Step.is_file,
                "is_symlink": walk.Step.is_symlink,
                "lstat": lambda s: stat.S_ISDIR(s.lstat().st_mode),
            }.items()
        }
    finally:
        os.close(fd)
    assert kinds == {
        "d": (True, False, False, False),
        "d/x": (False, True, False, False),
        "f": (False, True, False, False),
        "ld": (False, False, True, True),
        "lf": (False, False, True, True),
    }
    assert leaves == {"is_dir": [True], "is_file": [False], "is_symlink": [False], "lstat": [True]}
    assert [rel for _, rel in _steps(top)] == ["d", "d/x", "f", "ld", "lf"]
    assert [rel for _, rel in _steps(top, walk.Policy(files_first=True))] == [
        "f",
        "ld",
        "lf",
        "d",
        "d/x",
    ]


def test_hold_marks_the_directories_along_the_current_path_held(tmp_short: Path) -> None:
    """`hold()` at an entry (a caller that left it in place) makes its directories' LEAVE
    steps say `held`, and no other's."""
    top = tmp_short / "top"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "kept").write_text("k")
    (top / "c").mkdir()
    fd = os.open(top, _DIR)
    try:
        w = walk.Walk(fd, walk.Policy(leave=True))
        held = {}
        for s in w:
            if s.rel == "a/b/kept":
                w.hold()
            if s.kind == walk.LEAVE:
                held[s.rel] = s.held
    finally:
        os.close(fd)
    assert held == {"a/b": True, "a": True, "c": False}
