"""A worktree filled from a template by copy-on-write clone (system/reflink.py, system/indexstat.py,
lifecycle/clonecheckout.py) on a real XFS image with reflinks: the clone is what `git worktree
add` of the same commit writes, file for file, its index git's without a refresh, and its data
shared with the template; a template that does not match, or a filesystem without reflinks,
gets git's checkout and says so."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import anyio
import pytest
from xumd.lifecycle import clonecheckout
from xumd.system import indexstat, reflink
from xumd.system.git import Git

from tests.support.gitrepo import git, make_repo
from tests.support.reflinkfs import xfs_reflink

BIG = 8 << 20


def _repo(path: Path) -> Path:
    files = {
        ".gitignore": "build/\n*.log\n",
        "README.md": "hello\n",
        "src/a/b/c/deep.py": "x = 1\n" * 50,
        "src/empty.txt": "",
        "docs/ü nicode name.md": "text\n",
    }
    make_repo(path, files)
    (path / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    (path / "tool.sh").chmod(0o755)
    (path / "blob.bin").write_bytes(os.urandom(BIG))
    os.symlink("src/a/b/c/deep.py", path / "link")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "more")
    (path / "build").mkdir()
    (path / "build" / "out.o").write_bytes(b"ignored")
    return path


def _tree(top: Path) -> dict[str, tuple[str, int, bytes]]:
    """Every entry below `top` but `.git`: (kind, permission bits, content or link target)."""
    found: dict[str, tuple[str, int, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if not (dirpath == str(top) and d == ".git")]
        for name in filenames + dirnames:
            path = Path(dirpath) / name
            if path == top / ".git":
                continue
            st = os.lstat(path)
            rel = str(path.relative_to(top))
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", 0, os.readlink(path).encode())
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", stat.S_IMODE(st.st_mode), b"")
            else:
                found[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return found


def _new_worktree(repo: Path, path: Path, branch: str) -> Path:
    git(repo, "worktree", "add", "-q", "--no-checkout", "-b", branch, str(path), "HEAD")
    return path


def _fill(checkout: Path, template: Path | None) -> str:
    return anyio.run(clonecheckout.fill, Git(), checkout, template)


def _used_bytes(path: Path) -> int:
    vfs = os.statvfs(path)
    return (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize


def _assert_is_git_checkout(repo: Path, checkout: Path, reference: Path) -> None:
    assert _tree(checkout) == _tree(reference)
    # The index's stat data is the checkout's: git finds no entry to look at again.
    assert git(checkout, "diff-files", "--name-only") == ""
    assert git(checkout, "diff-index", "--cached", "--name-only", "HEAD") == ""
    assert git(checkout, "status", "--porcelain", "--untracked-files=all") == ""
    assert git(checkout, "ls-files", "-s") == git(reference, "ls-files", "-s")


def test_a_clone_is_the_checkout_git_would_write(tmp_short: Path) -> None:
    with xfs_reflink(tmp_short) as xfs:
        repo = _repo(xfs / "repo")
        template = xfs / "template"
        git(repo, "worktree", "add", "-q", "-b", "tmpl", str(template), "HEAD")
        reference = xfs / "reference"
        git(repo, "worktree", "add", "-q", "-b", "ref", str(reference), "HEAD")
        checkout = _new_worktree(repo, xfs / "w1", "w1")
        before = _used_bytes(xfs)
        assert _fill(checkout, template) == "reflink"
        assert _used_bytes(xfs) - before < BIG // 2  # the 8 MiB file's data is shared
        _assert_is_git_checkout(repo, checkout, reference)
        # Shared copy-on-write: a write to the clone leaves the template's file as it was.
        (checkout / "README.md").write_text("changed\n")
        assert (template / "README.md").read_text() == "hello\n"
        assert git(checkout, "status", "--porcelain") == " M README.md\n"


@pytest.mark.parametrize("change", ["edited", "extra", "missing", "other-tree", "staged"])
def test_a_template_that_is_not_the_tree_gets_gits_checkout(tmp_short: Path, change: str) -> None:
    with xfs_reflink(tmp_short) as xfs:
        repo = _repo(xfs / "repo")
        template = xfs / "template"
        git(repo, "worktree", "add", "-q", "-b", "tmpl", str(template), "HEAD")
        reference = xfs / "reference"
        git(repo, "worktree", "add", "-q", "-b", "ref", str(reference), "HEAD")
        if change == "edited":  # same size, so only the stat test can tell
            (template / "README.md").write_text("HELLO\n")
        elif change == "extra":
            (template / "new.txt").write_text("untracked\n")
        elif change == "missing":
            (template / "src" / "empty.txt").unlink()
        elif change == "other-tree":
            (template / "README.md").write_text("next\n")
            git(template, "commit", "-q", "-am", "next")
        else:
            (template / "README.md").write_text("staged\n")
            git(template, "add", "README.md")
        checkout = _new_worktree(repo, xfs / "w1", "w1")
        assert _fill(checkout, template) == "git"
        _assert_is_git_checkout(repo, checkout, reference)


def test_without_reflinks_git_writes_the_checkout(tmp_short: Path) -> None:
    """The test machines' /tmp is ext4 (or tmpfs): no FICLONE there."""
    repo = _repo(tmp_short / "repo")
    template = tmp_short / "template"
    git(repo, "worktree", "add", "-q", "-b", "tmpl", str(template), "HEAD")
    if reflink.supported(template, tmp_short):
        pytest.skip(f"{tmp_short} clones (a filesystem with reflinks)")
    reference = tmp_short / "reference"
    git(repo, "worktree", "add", "-q", "-b", "ref", str(reference), "HEAD")
    checkout = _new_worktree(repo, tmp_short / "w1", "w1")
    assert _fill(checkout, template) == "git"
    assert _fill(_new_worktree(repo, tmp_short / "w2", "w2"), None) == "git"
    _assert_is_git_checkout(repo, checkout, reference)


def test_a_sparse_template_index_is_not_rewritten(tmp_short: Path) -> None:
    repo = _repo(tmp_short / "repo")
    git(repo, "sparse-checkout", "set", "--no-cone", "src/")
    index = Path(git(repo, "rev-parse", "--path-format=absolute", "--git-path", "index").strip())
    with pytest.raises(indexstat.Unsupported, match="skip-worktree"):
        indexstat.read(index)
