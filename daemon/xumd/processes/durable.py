"""The durable I/O of a process that may outlive the daemon: ROOT/processes/<process-id>/.

    output       stdout + stderr, appended by the child (mode 0600; see output_log.py)
    output.meta  the dropped range of `output` (written before a hole is punched)
    stdin        a FIFO (mode 0600) the child holds open read-write as its stdin

Why a FIFO held read-write: a pipe's write end lives in the daemon, so the child would read EOF
the moment the daemon stops. The child's own read-write descriptor is a writer that lives as long
as the child, so its stdin never ends because of the daemon; the daemon opens the FIFO's write
end (non-blocking) to write, and the next daemon opens it again after adoption. The price: that
stdin can never be closed (`process.write {eof: true}` is refused with a clear error).

The directory is created (mode 0700) before the child starts and removed when the daemon forgets
the process (its exited record is pruned, or the daemon stops and the process is not kept); at
start-up, directories that no lease or record claims are swept.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from xumd.base import logs
from xumd.processes.output_log import OutputLog, create_meta
from xumd.system import fsdelete

log = logs.get("xumd.processes.durable")

_NAME_RE = re.compile(r"proc_[0-9a-f]{16}")


@dataclass
class DurableIO:
    directory: Path
    _writer: int | None = field(default=None, repr=False)

    @property
    def output(self) -> Path:
        return self.directory / "output"

    @property
    def meta(self) -> Path:
        return self.directory / "output.meta"

    @property
    def stdin(self) -> Path:
        return self.directory / "stdin"

    @classmethod
    def create(cls, base: Path, process_id: str) -> DurableIO:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        io = cls(base / process_id)
        io.directory.mkdir(mode=0o700)
        try:
            os.mkfifo(io.stdin, 0o600)
            os.close(os.open(io.output, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
            create_meta(io.meta)
        except BaseException:
            io.remove()
            raise
        return io

    @classmethod
    def existing(cls, base: Path, process_id: str) -> DurableIO | None:
        io = cls(base / process_id)
        try:
            if stat.S_ISFIFO(io.stdin.lstat().st_mode) and io.output.is_file():
                return io
        except OSError:
            pass
        return None

    def child_stdio(self) -> tuple[int, int]:
        """(stdin, stdout) descriptors for the child; the caller closes them once it started.
        Opening a FIFO read-write does not block (Linux), and makes the child its own writer."""
        stdin = os.open(self.stdin, os.O_RDWR | os.O_CLOEXEC)
        try:
            stdout = os.open(self.output, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except BaseException:
            os.close(stdin)
            raise
        return stdin, stdout

    def open_log(self, *, head_limit: int, tail_limit: int) -> OutputLog:
        return OutputLog(self.output, self.meta, head_limit=head_limit, tail_limit=tail_limit)

    def writer(self) -> int:
        """The FIFO's write end (non-blocking). ENXIO: nobody holds the read end any more."""
        if self._writer is None:
            self._writer = os.open(self.stdin, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        return self._writer

    def close_writer(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(OSError):
                os.close(self._writer)
            self._writer = None

    def remove(self) -> None:
        self.close_writer()
        fsdelete.remove_tree(self.directory, ignore_errors=True)


def sweep(base: Path, keep: set[str]) -> list[str]:
    """Remove process directories that nothing claims any more (at start-up, before serving).
    Only real directories named like a process id are touched, never what a symlink points to."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(base))
    except FileNotFoundError:
        return removed
    for entry in entries:
        if entry.name in keep or not _NAME_RE.fullmatch(entry.name):
            continue
        if entry.is_dir(follow_symlinks=False):
            fsdelete.remove_tree(Path(entry.path), ignore_errors=True)
            removed.append(entry.name)
    if removed:
        log.info("process.io_swept", count=len(removed))
    return removed
