"""Bytecode for the code under test, written once per session.

Every test daemon, and every `xum` a test runs, is a new Python process that imports the
daemon's (or the client's) modules. Where PYTHONDONTWRITEBYTECODE is set (it is on the machines
these tests run on) no `__pycache__` is ever written, so each of those processes compiled every
module from source again: about as much CPU as all the rest of a daemon's start-up
(docs/PERFORMANCE.md, "Start-up"). The session writes the bytecode once, explicitly.

The files are checked-hash pycs: the interpreter compares each with its source's hash at every
import, so a source changed afterwards (an edit, a mutant written into a copy of the tree by
`make mutate`) is never run from stale bytecode, whatever its timestamp says.
"""

from __future__ import annotations

import importlib.util
import py_compile
from collections.abc import Iterable
from pathlib import Path

_FLAGS_CHECKED_HASH = 0b11
"""PEP 552 flags of a pyc: hash-based (bit 0) and checked against the source (bit 1)."""


def _fresh(source: bytes, cached: Path) -> bool:
    try:
        with open(cached, "rb") as handle:
            header = handle.read(16)
    except OSError:
        return False
    return (
        len(header) == 16
        and header[:4] == importlib.util.MAGIC_NUMBER
        and int.from_bytes(header[4:8], "little") == _FLAGS_CHECKED_HASH
        and header[8:16] == importlib.util.source_hash(source)
    )


def ensure(packages: Iterable[Path]) -> list[Path]:
    """Write a checked-hash pyc for every module under `packages` whose pyc is missing or does
    not match its source; return the modules compiled. A module that does not compile is
    skipped (its import fails in the test that needs it, with the real error)."""
    compiled: list[Path] = []
    for package in packages:
        for path in sorted(package.rglob("*.py")):
            cached = Path(importlib.util.cache_from_source(str(path)))
            if _fresh(path.read_bytes(), cached):
                continue
            try:
                py_compile.compile(
                    str(path),
                    cfile=str(cached),
                    doraise=True,
                    invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
                )
            except (py_compile.PyCompileError, OSError):
                continue
            compiled.append(path)
    return compiled
