"""The event loop's last line: exceptions no task awaited become structured log lines.

asyncio's default handler prints an unstructured traceback to stderr, which breaks the "JSON lines
off a TTY" rule and hides real problems among harmless ones. One harmless case is known: anyio's
raw-socket streams wait with `loop.add_reader(sock, fut.set_result, None)` and remove the reader
one loop turn later, so a read cancelled in that window (a peer reset mid-read) leaves a queued
`Future.set_result` on a cancelled future (`InvalidStateError`). The connection is being torn
down anyway; it is logged at debug. Everything else is an error with its traceback.
"""

from __future__ import annotations

import asyncio
from typing import Any

from xumd.base import logs

log = logs.get("xumd.loop")

READER_RACE = "reader_race"
UNHANDLED = "unhandled"


def classify(context: dict[str, Any]) -> str:
    exception = context.get("exception")
    message = str(context.get("message", ""))
    if isinstance(exception, asyncio.InvalidStateError) and message.startswith(
        "Exception in callback Future.set_result"
    ):
        return READER_RACE
    return UNHANDLED


def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    kind = classify(context)
    if kind == READER_RACE:
        log.debug("loop.reader_race_ignored")
        return
    exception = context.get("exception")
    log.error(
        "loop.unhandled",
        message=str(context.get("message", "")),
        exc_info=exception if isinstance(exception, BaseException) else None,
    )


def install() -> None:
    asyncio.get_running_loop().set_exception_handler(handle)
