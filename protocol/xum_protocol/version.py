"""Protocol versioning: additive within a major version (see docs/PROTOCOL.md)."""

from __future__ import annotations

PROTOCOL_VERSION = "1.5"
"""The version this package speaks: `major.minor`."""

SUPPORTED_PROTOCOLS: tuple[str, ...] = ("1.5",)
"""Every version a server built from this package can speak."""


def parse_version(text: str) -> tuple[int, int]:
    """Parse `major.minor` (a bare `major` means `major.0`); raise ValueError otherwise."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 2 or not all(p.isdigit() and len(p) <= 6 for p in parts):
        raise ValueError(f"protocol version must look like '1.0', got {text!r}")
    major = int(parts[0])
    minor = int(parts[1]) if len(parts) == 2 else 0
    return major, minor
