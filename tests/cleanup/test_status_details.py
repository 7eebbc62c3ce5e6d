"""`daemon.status`'s cleanup details are written without the models (cleanup/status.py
`summary_details`, `ObligationRow.as_json`): the bytes are what the models write, for every
state and for the values SQLite hands back as they were stored (an int where the model has a
float, a detail's `bytes` that is no int)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson
import pytest
from xumd.cleanup import status
from xumd.cleanup.obligations import ObligationRow, Obligations
from xumd.store import Store

BASE = ObligationRow.due_now(
    id="ob_0123456789abcdef",
    workspace_id="ws_0123456789abcdef",
    project_id="prj_0123456789abcdef",
    kind="reclaim",
    seq=2,
    path="/root/trash/x",
    dev=1,
    ino=2,
    incarnation="ab" * 16,
    detail={"bytes": 4096, "entry": "x", "nested": {"a": [1, 2.5, None]}},
    now=1_800_000_000.25,
)

ROWS = [
    BASE,
    dataclasses.replace(BASE, state="completed", attempts=1, next_attempt_at=5),
    dataclasses.replace(BASE, state="abandoned", reason="gone", last_error="x" * 300),
    dataclasses.replace(BASE, state="failed", reason="owed", next_attempt_at=7),
    dataclasses.replace(BASE, next_attempt_at=1_800_000_100, created_at=3, updated_at=4),
    dataclasses.replace(BASE, detail={"bytes": "many"}),
    dataclasses.replace(BASE, detail={"bytes": True}),
    dataclasses.replace(BASE, detail={}),
]


@pytest.mark.parametrize("row", ROWS)
def test_an_obligation_is_written_as_its_model_writes_it(row: ObligationRow) -> None:
    assert orjson.dumps(row.as_json()) == orjson.dumps(row.model().model_dump(mode="json"))


def _store(tmp_short: Path, rows: list[ObligationRow]) -> Obligations:
    store = Store(tmp_short / "state.db")
    store.migrate()
    obligations = Obligations(store)
    with store.transaction():
        for row in rows:
            obligations.insert(row)
    return obligations


@pytest.mark.parametrize("which", ["none", "pending", "mixed"])
def test_the_summary_is_written_as_its_model_writes_it(tmp_short: Path, which: str) -> None:
    chosen: dict[str, list[ObligationRow]] = {
        "none": [],
        "pending": [BASE],
        "mixed": [
            dataclasses.replace(row, id=f"ob_{index:016x}", seq=index)
            for index, row in enumerate(ROWS)
        ],
    }
    obligations = _store(tmp_short, chosen[which])
    expected: Any = status.summary(obligations).model_dump(mode="json")
    assert orjson.dumps(status.summary_details(obligations)) == orjson.dumps(expected)
    if which != "none":
        assert expected["oldest"] is not None
