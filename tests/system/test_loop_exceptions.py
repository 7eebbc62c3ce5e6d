"""Exceptions nobody awaited become structured log lines; the known anyio race is quiet."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs
from xumd.system import loop_exceptions


def test_the_anyio_reader_race_is_classified_as_harmless() -> None:
    context = {
        "message": "Exception in callback Future.set_result(None)",
        "exception": asyncio.InvalidStateError("invalid state"),
    }
    assert loop_exceptions.classify(context) == loop_exceptions.READER_RACE


def test_anything_else_is_an_error_log_line() -> None:
    loop = asyncio.new_event_loop()
    try:
        with capture_logs() as logs:
            loop_exceptions.handle(
                loop,
                {
                    "message": "Task exception was never retrieved",
                    "exception": RuntimeError("boom"),
                },
            )
            loop_exceptions.handle(
                loop,
                {
                    "message": "Exception in callback Future.set_result(None)",
                    "exception": asyncio.InvalidStateError("invalid state"),
                },
            )
    finally:
        loop.close()
    events = [(entry["event"], entry["log_level"]) for entry in logs]
    assert events == [("loop.unhandled", "error"), ("loop.reader_race_ignored", "debug")]
