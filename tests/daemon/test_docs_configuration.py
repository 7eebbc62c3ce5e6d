"""docs/CONFIGURATION.md documents every daemon config key, with its default."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from xumd.base.config_schema import DaemonConfig

DOC = Path(__file__).parents[2] / "docs" / "CONFIGURATION.md"


def _documented_defaults() -> dict[str, Any]:
    text = DOC.read_text()
    block = text.split("```toml\n# ROOT/config.toml: the defaults\n", 1)[1].split("```", 1)[0]
    return tomllib.loads(block)


def _defaults(model: BaseModel) -> dict[str, Any]:
    return model.model_dump()


def test_every_key_is_documented_with_its_default() -> None:
    assert _documented_defaults() == _defaults(DaemonConfig())


def test_the_documented_file_is_a_valid_config() -> None:
    DaemonConfig.model_validate(_documented_defaults())
