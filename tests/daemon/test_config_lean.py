"""The daemon's configuration is validated without pydantic (xumd.base.config), and agrees with the
pydantic schema the documentation is written from (xumd.base.config_schema): the same defaults, the
same values taken (pydantic's lax reading), the same refusals in the same words."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from xumd.base import config, config_schema

CASES: list[dict[str, Any]] = [
    {},
    {"git_timeout_s": 0},
    {"git_timeout_s": -1},
    {"git_timeout_s": "soon"},
    {"git_timeout_s": "12.5"},
    {"git_timeout_s": True},
    {"git_timeout_s": [1]},
    {"fetch_timeout_s": float("nan")},
    {"max_connections": 0},
    {"max_connections": 2.0},
    {"max_connections": 2.5},
    {"max_connections": "40"},
    {"max_connections": "forty"},
    {"max_connections": {"a": 1}},
    {"event_ring_size": 1_000_001},
    {"enable_test_methods": "yes"},
    {"enable_test_methods": 1},
    {"enable_test_methods": 2},
    {"enable_test_methods": "perhaps"},
    {"enable_test_methods": [True]},
    {"unknown_key": 1},
    {"cleanup": 5},
    {"cleanup": {"backoff_jitter": 1.5, "batch_size": 0}},
    {"cleanup": {"typo": 1}},
    {"processes": {"cgroup": ""}},
    {"processes": {"cgroup": 5}},
    {"processes": {"output_poll_s": 6}},
    {"processes": {"keep_processes": True, "output_tail_bytes": 2048}},
    {"gc": {"archived_after_days": 1.5, "archive_merged": True}},
    {"gc": {"rebuildable": ["node_modules/", "target/"], "min_free_percent": 10}},
    {"gc": {"rebuildable": "node_modules/"}},
    {"gc": {"rebuildable": ["node_modules/", 5]}},
    {"gc": {"min_free_percent": 101, "max_bytes": -1}},
    {"ports": {"range_start": 30000, "range_end": 20000}},
    {"ports": {"range_start": 30000, "range_end": 20000, "count": 65}},
    {"ports": {"count": 4}},
    {"usage": {"cache_s": 0, "deadline_s": 0}},
    {"create": {"copy_max_bytes": -1}},
    {"git_timeout_s": 0, "unknown_key": 1, "cleanup": {"batch_size": 0}},
]


def _words(exc: Exception) -> str:
    # pydantic adds a link to its documentation under each error: not part of the message.
    return "\n".join(
        line for line in str(exc).splitlines() if "For further information visit" not in line
    )


@pytest.mark.parametrize("values", CASES, ids=[repr(c)[:60] for c in CASES])
def test_the_lean_validator_agrees_with_the_schema(values: dict[str, Any]) -> None:
    try:
        expected = config_schema.DaemonConfig.model_validate(values)
    except ValidationError as exc:
        with pytest.raises(config.Invalid) as refused:
            config.DaemonConfig(**values)
        assert _words(refused.value) == _words(exc)
        return
    got = config.DaemonConfig(**values)
    assert got.model_dump() == expected.model_dump()
    assert {k: type(v) for k, v in got.model_dump().items()} == {
        k: type(v) for k, v in expected.model_dump().items()
    }


def test_a_refused_file_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[cleanup]\nbatch_size = 0\n")
    with pytest.raises(config.ConfigError) as refused:
        config.load(path)
    message = str(refused.value)
    assert message.startswith(f"invalid configuration in {path}: 1 validation error for")
    assert re.search(r"cleanup\.batch_size\n  Input should be greater than or equal to 1", message)


def test_keep_processes_set_after_loading_is_checked() -> None:
    loaded = config.DaemonConfig()
    loaded.processes.keep_processes = True
    assert loaded.processes.keep_processes is True
    with pytest.raises(config.Invalid):
        loaded.processes.keep_processes = "perhaps"  # type: ignore[assignment]
