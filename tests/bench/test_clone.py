"""The copy-on-write bench on a real XFS image with reflinks: the fill from a template is the
reflink one, and `[create] copy` of the ignored outputs clones every file and writes less data
than the plain copy it is paired with (no timing is asserted)."""

from __future__ import annotations

from pathlib import Path

from bench import clone
from tests.support.reflinkfs import xfs_reflink


def test_the_bench_clones_the_checkout_and_the_ignored_outputs(tmp_short: Path) -> None:
    with xfs_reflink(tmp_short) as xfs:
        figures, used = clone._both(xfs, files=60, copy_files=40, repeats=1)
    assert used == {"reflink"}
    fill, copy = figures
    for fig in figures:
        assert fig.complete and len(fig.xum) == 1 and fig.xum[0] > 0 and fig.baseline[0] > 0
    assert fill.name == "worktree from a template (60 files)"
    assert copy.note.startswith("40 cloned, 0 copied; data written: ")
    mine, floor = (float(part.split()[0]) for part in copy.note.split(": ")[1].split(" against "))
    assert mine < floor
