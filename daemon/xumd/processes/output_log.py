"""A durable, bounded output log: the on-disk form of the output ring, for processes that may
outlive the daemon (see docs/PROCESSES.md).

The child writes its stdout and stderr straight into `output` (O_APPEND, mode 0600): no pipe to
the daemon, so a daemon that stops or crashes causes no SIGPIPE/EPIPE, and what the child writes
while no daemon runs is not lost. The daemon only reads the file.

Offsets are file offsets, so they stay valid across a daemon restart: a reader's `next` from
before the restart continues where it left off after it.

Bounded like the ring: the first `head` bytes are kept forever (rounded up to the filesystem
block), the last `tail` bytes are kept, and what falls between is dropped and counted. Dropping
punches a hole (fallocate PUNCH_HOLE | KEEP_SIZE): the blocks are freed while the child keeps
appending, with no race and no copy, and the offsets of the kept bytes do not move. The file's
apparent size (`ls -l`) is the stream's length; its allocated size (`du`) is the bound:
head + 2 * tail (compaction starts at twice the tail and keeps one tail) + one block, plus what
the child writes between two polls. `output.meta` records the dropped range before the hole is
punched, so a reader never sees the zeros of a hole, also after a restart.

Following: inotify is not in the standard library, so the daemon polls `fstat` at a bounded
interval (100 ms by default): a few microseconds per process, and the interval bounds both the
latency of a long-poll and how far a chatty process can overshoot the bound between compactions.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import stat
from pathlib import Path

import anyio

from xumd.base import logs
from xumd.processes.ring import Chunk, Waitable
from xumd.system import smallfile
from xumd.system.platform import current

log = logs.get("xumd.processes.output_log")

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02

META_SLOT = 256
"""`output.meta` is two slots of this size, written in place and in turn, each one JSON object
padded with spaces. The file is written whole before the child starts (`create_meta`), so
recording a drop never needs a new block: on a full disk (the child filled it between two
polls) the record must not fail, since the hole it precedes is what frees the space. A write
torn by a crash spoils one slot; the other still holds the range before it."""


def create_meta(path: Path) -> None:
    """Write `path`'s two empty slots (a new process's, before its child starts: a full disk
    refuses the spawn here, not a drop later)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        blank = (b" " * (META_SLOT - 1) + b"\n") * 2
        if os.write(fd, blank) != len(blank):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    finally:
        os.close(fd)


_FALLOCATE = current().fallocate()


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free the blocks of [offset, offset + length) without changing the file's size."""
    if _FALLOCATE is None:
        raise OSError(errno.EOPNOTSUPP, "fallocate is not available on this platform")
    if length <= 0:
        return
    if _FALLOCATE(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def hole_punching_problem(directory: Path) -> str | None:
    """Why output logs cannot be bounded in `directory` (None: they can): the filesystem must
    support PUNCH_HOLE (ext4, xfs, btrfs, tmpfs do)."""
    probe = directory / ".punch-probe"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, b"\0" * 8192)
            punch_hole(fd, 0, 4096)
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
    except OSError as exc:
        return f"cannot punch holes in {directory}: {exc.strerror or exc}"
    return None


def _align_up(value: int, block: int) -> int:
    return -(-value // block) * block


def _align_down(value: int, block: int) -> int:
    return value // block * block


class OutputLog(Waitable):
    """Reads a process's output file as a bounded stream (the same read API as OutputRing)."""

    def __init__(self, path: Path, meta_path: Path, *, head_limit: int, tail_limit: int) -> None:
        self.path = path
        self.meta_path = meta_path
        self.tail_limit = tail_limit
        self.total = 0
        self.closed = False
        self._changed: anyio.Event | None = None
        self._punch_failed = False
        self._meta_seq = 0
        self._meta_failing = False
        # Read-write: punching a hole needs write access. The daemon never writes to it.
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        self.block = os.fstat(self._fd).st_blksize or 4096
        meta = self._load_meta()
        self.hole_start = int(meta.get("hole_start", _align_up(head_limit, self.block)))
        self.kept_from = max(int(meta.get("kept_from", self.hole_start)), self.hole_start)
        self.refresh()

    # -- the stream ------------------------------------------------------------------------

    @property
    def dropped(self) -> int:
        return self.kept_from - self.hole_start

    def refresh(self) -> bool:
        """Take in what the child appended since the last look; True when there was some."""
        if self._fd is None:
            return False
        size = os.fstat(self._fd).st_size
        if size <= self.total:
            # A drop that could not be recorded last time is tried again at every poll, not
            # only when the child writes more: a child stopped by a full disk writes nothing
            # more until the drop frees the space.
            self._compact()
            return False
        self.total = size
        self._compact()
        self._wake()
        return True

    def read(self, since: int, max_bytes: int) -> Chunk:
        """Bytes from offset `since` (clamped to what is kept), at most `max_bytes`."""
        since = min(max(since, 0), self.total)
        start, dropped = since, 0
        if self.hole_start <= since < self.kept_from:
            start, dropped = self.kept_from, self.kept_from - since
        end = self.total
        if start < self.hole_start < self.kept_from:
            end = self.hole_start  # the head only: the next read reports the gap
        count = min(max_bytes, end - start)
        return Chunk(start, self._pread(start, count) if count > 0 else b"", dropped)

    async def follow(self, interval_s: float) -> None:
        """Poll the file until the log is closed (see the module's note on polling)."""
        while not self.closed:
            try:
                self.refresh()
            except OSError as exc:
                log.warning("output_log.refresh_failed", path=str(self.path), error=str(exc))
            await anyio.sleep(interval_s)

    def close(self) -> None:
        """The process ended: take in the last bytes; reads go on (by path) until `remove`."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                self.refresh()
            os.close(self._fd)
            self._fd = None
        self.closed = True
        self._wake()

    # -- internals -------------------------------------------------------------------------

    def _pread(self, offset: int, count: int) -> bytes:
        if self._fd is not None:
            return os.pread(self._fd, count, offset)
        # Closed (an exited process): no descriptor kept per exited record, open per read.
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return b""
        try:
            return os.pread(fd, count, offset)
        finally:
            os.close(fd)

    def _compact(self) -> None:
        """Drop the middle once the kept tail is twice its limit: keep one tail, block aligned."""
        if self._punch_failed or self.total - self.kept_from <= 2 * self.tail_limit:
            return
        kept_from = _align_down(self.total - self.tail_limit, self.block)
        if kept_from <= self.kept_from:
            return
        assert self._fd is not None
        # Record first: a crash between the two leaves bytes on disk that are never served,
        # never zeros that are served as output. The next compaction punches them.
        try:
            self._save_meta(kept_from)
        except OSError as exc:
            # Nothing dropped without its record; the next poll tries again (said once).
            if not self._meta_failing:
                log.warning("output_log.meta_unsaved", path=str(self.meta_path), error=str(exc))
            self._meta_failing = True
            return
        if self._meta_failing:
            log.info("output_log.meta_saved", path=str(self.meta_path))
            self._meta_failing = False
        self.kept_from = kept_from
        try:
            punch_hole(self._fd, self.hole_start, kept_from - self.hole_start)
        except OSError as exc:
            self._punch_failed = True
            log.warning("output_log.punch_failed", path=str(self.path), error=str(exc))

    def _load_meta(self) -> dict[str, int]:
        """The newest readable slot of `output.meta` (see `META_SLOT`); a file in the older
        form (one JSON object, replaced whole) reads as slot 0 of sequence 0."""
        try:
            # Never blocking the event loop on something put in its place (a FIFO), never
            # following a symlink there.
            raw = smallfile.read_regular(self.meta_path, 64 * 1024, follow_symlinks=False)
        except OSError:
            return {}
        best: dict[str, int] = {}
        for start in range(0, max(len(raw), 1), META_SLOT):
            try:
                found = json.loads(raw[start : start + META_SLOT].strip(b" \n\0") or b"null")
            except ValueError:
                continue  # a torn slot: the other one holds the range before it
            if not isinstance(found, dict) or "kept_from" not in found:
                continue
            if not best or int(found.get("seq", 0)) > int(best.get("seq", 0)):
                best = found
        self._meta_seq = int(best.get("seq", 0))
        return best

    def _save_meta(self, kept_from: int) -> None:
        seq = self._meta_seq + 1
        body = json.dumps({"seq": seq, "hole_start": self.hole_start, "kept_from": kept_from})
        slot = body.encode().ljust(META_SLOT - 1) + b"\n"
        # Not O_CREAT: the file was written whole at spawn (a process from before that has
        # its older meta file, or none: then it is made, needing a block as before).
        flags = os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        if not os.path.lexists(self.meta_path):
            flags |= os.O_CREAT
        fd = os.open(self.meta_path, flags, 0o600)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, f"{self.meta_path} is not a regular file")
            if os.pwrite(fd, slot, (seq % 2) * META_SLOT) != len(slot):
                raise OSError(errno.EIO, f"short write to {self.meta_path}")
            # On the disk before the hole is punched (a block already the file's: no new space).
            os.fdatasync(fd)
        finally:
            os.close(fd)
        self._meta_seq = seq
