"""Where the daemon keeps things under its root (which root: `xum_protocol.discovery`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SUN_PATH_MAX = 107
"""Linux's sun_path holds 108 bytes including the terminating NUL."""


@dataclass(frozen=True, slots=True)
class RootPaths:
    root: Path

    @property
    def lock(self) -> Path:
        return self.root / "xumd.lock"

    @property
    def socket(self) -> Path:
        return self.root / "xumd.sock"

    @property
    def database(self) -> Path:
        return self.root / "state.db"

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def workspaces(self) -> Path:
        return self.root / "workspaces"

    @property
    def trash(self) -> Path:
        return self.root / "trash"

    @property
    def archive_store(self) -> Path:
        return self.root / "archive"


def socket_path_problem(path: Path) -> str | None:
    """Why `path` cannot be bound as a Unix socket, or None."""
    size = len(os.fsencode(path))
    if size > SUN_PATH_MAX:
        return (
            f"socket path {str(path)!r} is {size} bytes, over the {SUN_PATH_MAX}-byte limit of a "
            "Unix socket path; use a shorter --root, or --socket PATH (env XUM_SOCKET) to put the "
            "socket elsewhere"
        )
    return None
