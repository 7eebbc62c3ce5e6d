"""The proof on the bytes at the module level (daemon/xumd/lifecycle/onbytes.py): what cannot be
read is unproven and refused by name; a sha256 repository is hashed as git hashes it; the raw
copy keeps a path beyond PATH_MAX and a nested repository whole."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import anyio
import pytest
from xumd.base.errors import XumError
from xumd.lifecycle import onbytes
from xumd.system import rawcopy
from xumd.system.git import Git

from tests.support.gitrepo import GIT_ENV, git, make_repo
from tests.support.ondisk import deep_dir, disk
from tests.support.otheruser import as_nobody


def _account(checkout: Path, tree: str = "HEAD^{tree}") -> onbytes.Account:
    async def run() -> onbytes.Account:
        g = Git()
        resolved = await g.out(checkout, "rev-parse", tree)
        return await onbytes.account(g, checkout, resolved, [], scratch=checkout.parent / "tmp")

    return anyio.run(run)


def test_a_directory_the_daemon_cannot_read_is_unproven_and_refused_by_name(
    tmp_short: Path,
) -> None:
    """A real permission (the walk runs as another user): never taken for an empty or a
    saved directory."""
    top = tmp_short / "co"
    (top / "open").mkdir(parents=True)
    (top / "open" / "a.txt").write_text("readable\n")
    (top / "locked").mkdir()
    (top / "locked" / "work.txt").write_text("mine\n")
    os.chmod(tmp_short, 0o755)
    os.chmod(top, 0o755)
    os.chmod(top / "locked", 0o700)  # root's; nobody may not list it
    settings = onbytes._Settings("sha1", "false", "", True, True, False)
    tree = {"open/a.txt": ("100644", "0" * 40)}

    def walk() -> tuple[list[tuple[str, str]], list[str]]:
        w = onbytes._Walk(onbytes.Account(), tree, {}, {}, set(), set(), settings)
        onbytes._walk_checkout(top, w)
        return w.account.unproven, [e.path for e in w.account.raw]

    unproven, raw = as_nobody(walk)
    assert unproven == [("locked", "Permission denied")]
    assert raw == []  # `locked` is not an empty directory: it is unknown

    class Row:
        name = "co"
        path = top

    proof = onbytes.Account(unproven=unproven)
    with pytest.raises(XumError) as refused:
        onbytes.refuse_unproven(Row(), proof, "archive")  # type: ignore[arg-type]
    assert refused.value.kind.value == "not_safe"
    assert "locked (Permission denied)" in refused.value.message
    assert refused.value.data["unproven"] == [{"path": "locked", "reason": "Permission denied"}]


def test_a_flagged_edit_in_a_sha256_repository_is_found(tmp_short: Path) -> None:
    repo = tmp_short / "r256"
    repo.mkdir()
    git(repo, "init", "-q", "--object-format=sha256", "-b", "main")
    (repo / "cfg").write_text("one\n")
    (repo / "same").write_text("unchanged\n")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    git(repo, "update-index", "--assume-unchanged", "cfg", "same")
    (repo / "cfg").write_text("two\n")
    proof = _account(repo)
    assert [(e.path, e.why) for e in proof.raw] == [("cfg", "index_flag")]
    assert proof.flags == {"cfg": "assume_unchanged", "same": "assume_unchanged"}


def test_a_clean_checkout_reads_no_file(tmp_short: Path) -> None:
    """Files git's own add looked at are not read again: only the listing is walked."""
    repo = make_repo(tmp_short / "plain", {"a.txt": "a\n", "d/b.txt": "b\n"})
    proof = _account(repo)
    assert proof.raw == [] and proof.unproven == []
    assert proof.walked == 3  # a.txt, d, d/b.txt


def test_the_raw_copy_keeps_a_path_beyond_path_max_and_a_nested_repository_whole(
    tmp_short: Path,
) -> None:
    src = tmp_short / "src"
    src.mkdir()
    (src / "deep").mkdir()
    deep_dir(src / "deep", 4200)
    make_repo(src / "vendor" / "dep", {"x.py": "x\n"})
    (src / "vendor" / "dep" / "x.py").write_text("edited\n")
    before = disk(src)
    store = tmp_short / "store"
    rawcopy.save(src, ["deep", "vendor/dep"], store)
    # a restore wrote something else at the nested repository (a gitlink's empty directory)
    dest = tmp_short / "dest"
    (dest / "vendor" / "dep").mkdir(parents=True)
    placed = rawcopy.place(store, dest, ["deep", "vendor/dep"])
    assert placed.placed == ["deep", "vendor/dep"] and placed.problems == []
    assert disk(dest) == before
    assert rawcopy.same(store, dest, "vendor/dep") and rawcopy.same(store, dest, "deep")
    (dest / "vendor" / "dep" / "x.py").write_text("changed again\n")
    assert not rawcopy.same(store, dest, "vendor/dep")


def test_a_non_empty_directory_in_the_way_is_never_deleted_to_place_an_entry(
    tmp_short: Path,
) -> None:
    src = tmp_short / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "saved.txt").write_text("saved\n")
    store = tmp_short / "store"
    rawcopy.save(src, ["d"], store)
    dest = tmp_short / "dest"
    (dest / "d").mkdir(parents=True)
    (dest / "d" / "other.txt").write_text("someone else's\n")
    placed = rawcopy.place(store, dest, ["d"])
    assert placed.problems == ["d"]
    assert (dest / "d" / "other.txt").read_text() == "someone else's\n"


ATTRS = ["", "text", "-text", "text=auto", "eol=lf", "eol=crlf", "text eol=crlf", "crlf", "-crlf"]
ATTRS += ["crlf=input", "binary"]
CONFIGS = [("false", ""), ("true", ""), ("input", ""), ("false", "crlf")]


def _git_bytes(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(
        ["git", "-C", str(repo), *args], input=stdin, capture_output=True, env=env, check=True
    )
    return done.stdout


@pytest.mark.parametrize("autocrlf, eol", CONFIGS)
@pytest.mark.parametrize("attr", ATTRS)
def test_a_files_conversion_class_is_never_weaker_than_what_git_does(
    tmp_short: Path, attr: str, autocrlf: str, eol: str
) -> None:
    """Against git itself: a file whose checkout git rewrites is compared with what checkout
    writes ("predict"); one whose add git rewrites is at least hashed raw ("hash")."""
    repo = tmp_short / "conv"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "core.autocrlf", autocrlf)
    if eol:
        git(repo, "config", "core.eol", eol)
    if attr:
        (repo / ".gitattributes").write_text(f"f.txt {attr}\n")
    (repo / "f.txt").write_bytes(b"one\r\ntwo\nthree\r\n")
    cleaned = _git_bytes(repo, "hash-object", "--path=f.txt", "f.txt").strip()
    raw = _git_bytes(repo, "hash-object", "--no-filters", "f.txt").strip()
    blob = _git_bytes(repo, "hash-object", "-w", "--no-filters", "--stdin", stdin=b"a\nb\n")
    smudged = _git_bytes(repo, "cat-file", "--filters", "--path=f.txt", blob.decode().strip())
    listed = _git_bytes(repo, "check-attr", "-z", *onbytes._ATTRS, "--", "f.txt").split(b"\0")
    attrs = {listed[i + 1].decode(): listed[i + 2].decode() for i in range(0, len(listed) - 2, 3)}
    settings = onbytes._Settings("sha1", autocrlf, eol, True, True, True)
    how = onbytes._conversion(attrs, settings)
    if smudged != b"a\nb\n":
        assert how == "predict", (attrs, smudged)
    elif cleaned != raw:
        assert how in ("hash", "predict"), attrs
    else:
        assert how in ("", "hash"), attrs


def test_the_comparison_tells_kind_mode_size_and_content_apart(tmp_short: Path) -> None:
    """`rawcopy.same`, which the proof compares converted files with: by descriptor, never
    following a link."""
    left, right = tmp_short / "left", tmp_short / "right"
    left.mkdir()
    right.mkdir()
    a, b = left / "f", right / "f"
    a.write_bytes(b"same")
    b.write_bytes(b"same")
    assert rawcopy.same(left, right, "f")
    b.chmod(0o755)
    assert not rawcopy.same(left, right, "f")  # the executable bit
    b.chmod(0o644)
    b.write_bytes(b"sam3")
    assert not rawcopy.same(left, right, "f")  # same size, other bytes
    b.write_bytes(b"same, longer")
    assert not rawcopy.same(left, right, "f")
    b.unlink()
    b.symlink_to("same")
    assert not rawcopy.same(left, right, "f")  # a link is not a file
    a.unlink()
    a.symlink_to("same")
    assert rawcopy.same(left, right, "f")
    assert not rawcopy.same(left, right, "missing")
