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
    """Encode one message as a frame, newline included (written by orjson: no second copy)."""
    return orjson.dumps(message, option=orjson.OPT_APPEND_NEWLINE)


def decode(frame: bytes) -> Any:
    """Decode one frame (with or without its newline); raises ValueError on bad JSON."""
    return orjson.loads(frame)


def nul_free(frame: bytes) -> bool:
    """No string decoded from `frame` can contain a NUL character. JSON text carries a NUL
    inside a string only as the escape `\\u0000` (a raw control character there is invalid,
    and the decoder refuses it); a frame without that escape holds none. (A false "no"
    on a literal backslash followed by `u0000` only costs the full check.)"""
    return b"\\u0000" not in frame


class FrameReader:
    """Sans-IO NDJSON decoder: bytes in (as they arrive, split anywhere), frames out.

    `feed` returns the complete frames (newline stripped) in order. A frame longer than
    `max_frame` bytes (newline excluded) sets `oversize` and ends the stream: the frames complete
    before it are still returned, everything after it is ignored (the reader cannot know where
    the next frame would begin). Memory stays bounded by `max_frame` plus one read, and each byte
    is scanned for the delimiter once however the input is split. `finish` (end of input)
    returns the last frame when it lacked its newline.
    """

    __slots__ = ("_buf", "ended", "max_frame", "oversize")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()  # the start of a frame whose newline has not arrived
        self.oversize = False
        self.ended = False

    def feed(self, data: bytes) -> list[bytes]:
        if self.ended or not data:
            return []
        frames: list[bytes] = []
        start = 0
        if self._buf:
            end = data.find(DELIMITER)
            if end == -1:
                self._buf += data
                return self._overflow(frames) if len(self._buf) > self.max_frame else frames
            self._buf += data[:end]
            if len(self._buf) > self.max_frame:
                return self._overflow(frames)
            frames.append(bytes(self._buf))
            self._buf.clear()
            start = end + 1
        # The common case, nothing held over: frames are sliced straight out of the read.
        while (end := data.find(DELIMITER, start)) != -1:
            if end - start > self.max_frame:
                return self._overflow(frames)
            frames.append(data[start:end])
            start = end + 1
        if start < len(data):
            if len(data) - start > self.max_frame:
                return self._overflow(frames)
            self._buf += data[start:]
        return frames

    def _overflow(self, frames: list[bytes]) -> list[bytes]:
        self.oversize = True
        self.ended = True
        self._buf = bytearray()
        return frames

    def finish(self) -> bytes | None:
        """End of input: the last frame if it had no newline (None if nothing is held)."""
        if self.ended:
            return None
        self.ended = True
        frame = bytes(self._buf)
        self._buf = bytearray()
        return frame or None
