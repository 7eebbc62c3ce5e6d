"""fscopy's walks stop at mount boundaries (a known gap, now closed): the archive
store's copy of a directory and the size walk leave another mount's files out, and say so, as
the deletions of fsdelete.py never cross one. Real tmpfs and bind mounts (root only)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from xumd.system import fscopy

from tests.support.mounts import Mounts, real_mounts


@pytest.fixture
def mounts(tmp_short: Path) -> Iterator[Mounts]:
    with real_mounts(tmp_short) as m:
        yield m


@pytest.mark.parametrize("kind", ["tmpfs", "bind"])
def test_copy_tree_and_tally_do_not_enter_another_mount(
    tmp_short: Path, mounts: Mounts, kind: str
) -> None:
    src = tmp_short / "src"
    (src / "keep").mkdir(parents=True)
    (src / "keep" / "file").write_text("ours\n")
    inner = src / "keep" / "mnt"
    inner.mkdir()
    if kind == "tmpfs":
        mounts.tmpfs(inner)
    else:
        other = tmp_short / "other"  # the same filesystem: the same st_dev, another mount id
        other.mkdir()
        mounts.bind(other, inner)
    (inner / "theirs").write_bytes(b"x" * 100_000)

    sized = fscopy.tally(src)
    assert sized.mounts == ["keep/mnt"]
    assert "keep/mnt/theirs" not in sized.files

    copied = fscopy.copy_tree(src, tmp_short / "dest")
    assert copied.mounts == ["keep/mnt"]
    assert (tmp_short / "dest" / "keep" / "file").read_text() == "ours\n"
    assert not (tmp_short / "dest" / "keep" / "mnt").exists()
