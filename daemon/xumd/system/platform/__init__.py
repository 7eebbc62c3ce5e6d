"""Everything the daemon needs from the operating system, behind one interface.

Two backends: `linux` (/proc, prctl subreaper, pidfds, mountinfo and mount ids, cgroup v2) and
`portable` (psutil and POSIX calls only: what macOS and the BSDs have). `current()` picks one
once per process: `XUM_PLATFORM=linux|portable`, by default `linux` on Linux and `portable`
elsewhere. What the backend in use cannot guarantee is its `WEAKER` (daemon.status
details.platform; docs/RELIABILITY.md, "Platforms"). No module outside this package asks which
system it runs on (tests/architecture/test_platform_seam.py).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from xumd.system.platform.common import PathUser

ENV = "XUM_PLATFORM"
BACKENDS = ("linux", "portable")


class PlatformError(Exception):
    """XUM_PLATFORM names no backend this system can run (a start-up error)."""


class Platform(Protocol):
    """What a backend module provides (a module satisfies it structurally)."""

    NAME: str
    WEAKER: tuple[str, ...]
    CGROUPS: bool
    """Runs may get a cgroup v2 of their own (a configured or delegated one)."""
    O_LOOK: int
    """open(2) flags for a directory opened only to look at it (Linux O_PATH: no permission on
    it is needed; elsewhere O_RDONLY)."""

    # Process identity: a start in seconds since boot, anchored by procstat.
    def boot_id(self) -> str | None: ...
    def kernel_boot_time(self) -> float: ...
    def since_boot(self) -> float | None: ...
    def start_since_boot(self, pid: int, *, strict: bool = ...) -> tuple[float, bool] | None: ...
    def kernel_create_time(self, pid: int) -> float | None: ...
    def tree_since_boot(self, root: int) -> dict[int, float | None]: ...

    # Processes: list, state, the environment they started with (markers), command lines.
    def pids(self) -> list[int]: ...
    def state(self, pid: int) -> str | None: ...
    def may_be_mid_exec(self, pid: int) -> bool: ...
    def environ(self, pid: int) -> bytes | None: ...
    def argv(self, pid: int) -> tuple[str, ...]: ...
    def own_children(self) -> set[int]: ...
    def exe(self, pid: int) -> str | None: ...
    def name(self, pid: int) -> str: ...
    def cmdline(self, pid: int) -> bytes: ...
    def processes_of(
        self, uid: int, named: Callable[[str], bool]
    ) -> list[tuple[int, str, str]]: ...
    def open_holders(self, wanted: set[str]) -> dict[str, int]: ...
    def listeners(self, ports: set[int]) -> dict[int, set[int | None]]: ...

    # Containment and safe signalling.
    def set_subreaper(self) -> str | None: ...
    def is_subreaper(self) -> bool: ...
    def cgroup_delegated(self) -> Path | None: ...
    def pidfd_open(self, pid: int) -> int | None: ...
    def tool(self, name: str) -> str | None: ...
    def fallocate(self) -> Callable[[int, int, int, int], int] | None: ...
    def copy_file_range(
        self, src: int, dst: int, count: int, src_pos: int, dst_pos: int
    ) -> int: ...
    def release_free_heap(self) -> bool: ...

    # A path's users, mounts, descriptors.
    def users_under(
        self, root: str, exclude_pids: set[int], exclude_pgids: set[int], limit: int
    ) -> list[PathUser]: ...
    def mount_table(self) -> list[tuple[str, str | None]]: ...
    def mount_id(self, fd: int) -> int | None: ...
    def open_fd_count(self) -> int: ...

    # The socket.
    def unix_listener(self, path: str) -> bool: ...
    def peer_credentials(self, sock: socket.socket) -> tuple[int | None, int, int] | None: ...
    def launchd_functions(self) -> tuple[Any, Any] | None: ...


def choose(requested: str | None, system: str) -> str:
    """The backend's name for `XUM_PLATFORM=requested` on `system` (sys.platform)."""
    on_linux = system.startswith("linux")
    if not requested:
        return "linux" if on_linux else "portable"
    if requested not in BACKENDS:
        raise PlatformError(
            f"{ENV}={requested!r} names no platform backend (one of: {', '.join(BACKENDS)})"
        )
    if requested == "linux" and not on_linux:
        raise PlatformError(f"{ENV}=linux needs Linux (this is {system}): use portable")
    return requested


_current: Platform | None = None


def current() -> Platform:
    """The backend of this process, chosen at first use (PlatformError for a bad choice)."""
    global _current
    if _current is None:
        if choose(os.environ.get(ENV), sys.platform) == "linux":
            from xumd.system.platform import linux as backend
        else:
            from xumd.system.platform import portable as backend  # type: ignore[no-redef]
        _current = backend
    return _current


def status() -> dict[str, Any]:
    """daemon.status details.platform: the backend and what it cannot guarantee."""
    chosen = current()
    return {"backend": chosen.NAME, "weaker": list(chosen.WEAKER)}
