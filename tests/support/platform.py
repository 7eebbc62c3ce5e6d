"""The platform backend this test run's daemons and in-process code use (XUM_PLATFORM: `make
test-portable` runs the contract's tests against the portable one), and a fault in that
backend's reads of a process."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import psutil
import pytest
from xumd.system import platform
from xumd.system.platform import linux

BACKEND = platform.current()
PORTABLE = BACKEND.NAME == "portable"

# What each read is, per backend: Linux reads /proc/PID/<name>; portable asks psutil.
_PSUTIL_READS = {"environ": ("environ",), "stat": ("create_time", "status")}


def fail_process_read(
    monkeypatch: pytest.MonkeyPatch, read: str, code: int, *, pid: int | None = None
) -> None:
    """Make the backend's `read` ("environ" or "stat") of process `pid` (of every process when
    None) fail with errno `code`: Linux's own open of /proc/PID/<read>, or psutil's read of the
    same (environ; create_time and status)."""
    if not PORTABLE:
        real_open = open

        def failing(path: Any, *args: Any, **kwargs: Any) -> Any:
            name = str(path)
            hit = name == f"/proc/{pid}/{read}" if pid else name.endswith(f"/{read}")
            if hit:
                raise OSError(code, os.strerror(code), name)
            return real_open(path, *args, **kwargs)

        # The backend's own `open` (found before the builtin): only its /proc reads fail.
        monkeypatch.setattr(linux, "open", failing, raising=False)
        return
    for method in _PSUTIL_READS[read]:
        real = getattr(psutil.Process, method)

        def failing_method(self: psutil.Process, *args: Any, _real: Any = real, **kw: Any) -> Any:
            if pid is None or self.pid == pid:
                raise OSError(code, os.strerror(code))
            return _real(self, *args, **kw)

        monkeypatch.setattr(psutil.Process, method, failing_method)


def fail_mount_table(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """Make the backend's mount table unreadable: Linux's mountinfo path names `directory`
    (EISDIR); psutil's partitions raise EACCES."""
    if not PORTABLE:
        monkeypatch.setattr(linux, "MOUNTINFO", directory)
        return

    def unreadable(all: bool = False) -> list[Any]:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), "the mount table")

    monkeypatch.setattr(psutil, "disk_partitions", unreadable)
