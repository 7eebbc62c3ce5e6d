"""The benches' process launcher: a child that exits before its notify field fails at once with
its exit code and its own output (read before `stop` removes the log)."""

from __future__ import annotations

import shutil

import pytest

from bench import procs


def test_a_child_that_exits_before_ready_is_reported_with_its_output() -> None:
    where = procs.short_dir("xbp-")
    try:
        child = procs.Launched(["sh", "-c", "echo the-reason >&2; exit 3"], where / "s.sock")
        with pytest.raises(RuntimeError, match=r"no READY=1 .*\(exit 3\): the-reason"):
            child.start(timeout=60)
    finally:
        shutil.rmtree(where, ignore_errors=True)
