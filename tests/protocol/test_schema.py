"""The generated JSON Schema is committed and must match the models (run `make schema`)."""

from __future__ import annotations

import json
from pathlib import Path

from xum_protocol.errors import ERROR_CODES, ErrorKind
from xum_protocol.methods import METHODS
from xum_protocol.schema import SCHEMA_FILE, build_schema, render

SCHEMA = Path(__file__).resolve().parents[2] / "protocol" / "schema" / SCHEMA_FILE


def test_schema_file_is_up_to_date() -> None:
    assert SCHEMA.exists(), "protocol/schema is missing: run `make schema` and commit it"
    assert SCHEMA.read_bytes() == render(), (
        "protocol/schema/xum-protocol.schema.json is stale (a protocol model or the method "
        "table changed): run `make schema` and commit the result"
    )


def test_schema_covers_every_method_error_and_event() -> None:
    schema = build_schema()
    assert set(schema["methods"]) == set(METHODS)
    for name, entry in schema["methods"].items():
        assert entry["params"]["type"] == "object", name
        assert entry["result"]["type"] == "object", name  # results are objects, never bare
    assert schema["errors"] == {kind.value: code for kind, code in ERROR_CODES.items()}
    assert "event" in schema["notifications"]
    json.dumps(schema)


def test_error_codes_are_unique_and_in_range() -> None:
    codes = list(ERROR_CODES.values())
    assert len(codes) == len(set(codes))
    assert set(ERROR_CODES) == set(ErrorKind)
    standard = {-32700, -32600, -32601, -32602, -32603}
    for kind, code in ERROR_CODES.items():
        assert code in standard or -32099 <= code <= -32000, kind


def test_method_names_are_noun_verb() -> None:
    for name in METHODS:
        assert name == "hello" or (name.count(".") >= 1 and name == name.lower()), name
