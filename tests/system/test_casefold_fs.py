"""The case-insensitive filesystem the aliasing tests run on (tests/support/casefold_fs.py)
behaves as APFS does by default: names are kept as created, and any other case of a name is
the same file (one st_dev and st_ino), refused as a second creation, renamed and removed as it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.casefold_fs import case_insensitive_dir


@pytest.fixture
def ci() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="xcf"))
    try:
        with case_insensitive_dir(base) as directory:
            yield directory
    finally:
        shutil.rmtree(base, ignore_errors=True)


def identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def test_another_case_is_the_same_directory(ci: Path) -> None:
    (ci / "Fix").mkdir()
    assert identity(ci / "fix") == identity(ci / "FIX") == identity(ci / "Fix")
    assert os.listdir(ci) == ["Fix"]  # case-preserving
    with pytest.raises(FileExistsError):
        (ci / "fix").mkdir()
    with pytest.raises(FileExistsError):
        os.open(ci / "FIX", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    (ci / "fix" / "notes.txt").write_text("kept")
    assert (ci / "FIX" / "NOTES.TXT").read_text() == "kept"
    assert os.listdir(ci / "Fix") == ["notes.txt"]


def test_a_case_only_rename_keeps_the_file_and_takes_the_new_case(ci: Path) -> None:
    (ci / "fix").mkdir()
    (ci / "fix" / "a").write_text("a")
    before = identity(ci / "fix")
    os.rename(ci / "fix", ci / "Fix")
    assert os.listdir(ci) == ["Fix"]
    assert identity(ci / "fix") == before
    assert (ci / "FIX" / "A").read_text() == "a"


def test_removal_through_another_case_removes_the_one_entry(ci: Path) -> None:
    (ci / "Fix").mkdir()
    (ci / "other").mkdir()
    shutil.rmtree(ci / "fIX")
    assert os.listdir(ci) == ["other"]
    assert not (ci / "Fix").exists()


def test_git_works_on_it(ci: Path) -> None:
    repo = ci / "Repo"
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }

    def git(*args: str, cwd: Path = repo) -> str:
        done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    git("init", "-q", str(repo), cwd=ci)
    (repo / "f").write_text("x")
    git("add", "f")
    git("commit", "-qm", "one")
    assert git("status", "--porcelain", cwd=ci / "repo") == ""
    git("worktree", "add", "-q", "-b", "b", str(ci / "Wt"))
    assert (ci / "wt" / "F").read_text() == "x"
