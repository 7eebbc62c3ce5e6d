"""bench/ is held to what the daemon is held to: typed (mypy --strict, `make typecheck`) and every
wait bounded. The fuzz target's fake connection is checked against the router's `Peer` (a member
it lacked made every `events.subscribe` an internal error the fuzzer reported as a crash)."""

from __future__ import annotations

import shutil
import sys
import threading
import tomllib
import types
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import pytest

from bench import scale

REPO = Path(__file__).resolve().parents[2]


def test_bench_is_in_the_typecheck() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "bench" in config["tool"]["mypy"]["files"]


def test_run_threads_names_a_thread_that_never_ends() -> None:
    release = threading.Event()
    try:
        with pytest.raises(TimeoutError) as caught:
            scale.run_threads([lambda: None, lambda: release.wait(60)], 0.5)
        # The one that never ends is named (the quick one too, only if a loaded machine did
        # not schedule it within the deadline).
        message = str(caught.value)
        assert message.startswith("threads still running after 0.5 s: "), message
        assert message.endswith("bench-1"), message
    finally:
        release.set()


def test_run_threads_raises_what_a_thread_raised() -> None:
    def boom() -> None:
        raise RuntimeError("git worktree add failed")

    with pytest.raises(RuntimeError, match="worktree add failed"):
        scale.run_threads([lambda: None, boom], 30)


@pytest.fixture
def fuzz_target(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    # atheris is an optional install (bench/fuzz/requirements.txt): the target's own logic is
    # what is under test here, so the engine's two import-time hooks are stood in for.
    fake = types.ModuleType("atheris")
    fake.instrument_imports = nullcontext  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "atheris", fake)
    monkeypatch.delitem(sys.modules, "bench.fuzz.dispatch_target", raising=False)
    from bench.fuzz import dispatch_target

    yield dispatch_target
    dispatch_target.LOOP.close()
    dispatch_target.APP.store.close()
    shutil.rmtree(dispatch_target.APP.paths.root, ignore_errors=True)  # the target's own root


def test_fuzz_target_holds_its_properties_on_the_core_methods(
    fuzz_target: types.ModuleType,
) -> None:
    frames = [
        b'{"jsonrpc":"2.0","id":1,"method":"hello","params":{"protocol":"1.0"}}',
        b'{"jsonrpc":"2.0","id":2,"method":"events.subscribe"}',
        b'{"jsonrpc":"2.0","id":3,"method":"daemon.status"}',
        b'[{"jsonrpc":"2.0","id":4,"method":"nope"}, 5]',
    ]
    # Any answer breaking the target's properties (an internal error included) is an
    # AssertionError out of test_one_input.
    fuzz_target.test_one_input(b"\n".join(frames) + b"\n")
