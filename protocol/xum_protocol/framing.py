"""NDJSON framing: one JSON text per line, UTF-8, encoded with orjson.

A frame never contains a raw newline: JSON escapes newlines inside strings, and orjson emits
compact output, so `\n` is a safe delimiter.
"""

from __future__ import annotations

from typing import Any

import orjson

DEFAULT_MAX_FRAME = 16 * 1024 * 1024
"""Default cap on one frame (16 MiB); the daemon's is configurable."""

DELIMITER = b"\n"


def encode(message: Any) -> bytes:
    """Encode one message as a frame, newline included."""
    return orjson.dumps(message) + DELIMITER


def decode(frame: bytes) -> Any:
    """Decode one frame (with or without its newline); raises ValueError on bad JSON."""
    return orjson.loads(frame)
