"""The scope table of `make mutate` (mutation/run.py) names what is there, and the configuration it
gives cosmic-ray is well-formed: checked here in a second, without cosmic-ray (not installed in
the project's venv) and without running a mutant.

A module, test file or scoped function that moves, or a line of mutation/equivalent.toml that
changes, would otherwise show only in the next (hours long) mutation run: a scope that mutates
nothing, or survivors reported as unexplained.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_run", REPO / "mutation" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_every_scoped_path_function_and_explained_line_exists() -> None:
    assert _runner().problems() == []


def test_each_scopes_cosmic_ray_configuration_parses_and_keeps_lines_to_mutate() -> None:
    run = _runner()
    for pattern in run.EXCLUDED_OPERATORS:
        re.compile(pattern)
    kept = [f"core/ReplaceComparisonOperator_{pair}" for pair in ("Eq_NotEq", "Is_IsNot")]
    left_out = ["core/ReplaceComparisonOperator_Eq_Lt", "core/ReplaceBinaryOperator_Add_Mul"]
    excluded = re.compile("|".join(f"(:?{e})" for e in run.EXCLUDED_OPERATORS))
    # cosmic-ray's operators-filter matches the joined patterns at the start of each name.
    assert [op for op in kept if excluded.match(op)] == []
    assert [op for op in left_out if not excluded.match(op)] == []
    for scope in run.SCOPES:
        source = (REPO / scope.module).read_text()
        config = tomllib.loads(run.config(scope, "python", source))["cosmic-ray"]
        assert config["module-path"] == scope.module
        assert all(t in config["test-command"] for t in scope.tests)
        ranges = config["filters"]["line-filter"]["lines"][scope.module]
        assert ranges, scope.module
        for text in ranges:
            start, end = map(int, text.split("-"))
            assert 1 <= start <= end <= len(source.splitlines()), (scope.module, text)
