"""Per-directory exclusion: one operation at a time on a checkout's path, whatever spelling
reached it.

`directory(path)` keys a path by its realpath (existing components spelled as stored:
`checkouts.pathcase`) *and* by the filesystem identity (st_dev, st_ino) of its nearest existing
ancestor plus the remaining components (compared ignoring case where that ancestor's filesystem
does), so symlink, `..`, alias and other-case spellings of one path exclude each other.
Creation, restore and cleanup take it; the waiter revalidates the directory after it gets it.
The composition root builds one and hands it to the lifecycle coordinator and to the cleanup
service, so neither reaches into the other for it.

In-process state only: one daemon per root (invariant 7) makes it sufficient.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
from xum_protocol.errors import ErrorKind

from xumd.base import logs
from xumd.base.errors import XumError
from xumd.checkouts import pathcase

log = logs.get("xumd.checkouts.exclusion")


@dataclass(frozen=True, slots=True)
class DirKey:
    """A directory's identity for exclusion: two keys conflict when either part is equal."""

    realpath: str
    identity: tuple[int, int, str]

    def conflicts(self, other: DirKey) -> bool:
        return self.realpath == other.realpath or self.identity == other.identity


def dir_key(path: Path | str) -> DirKey:
    real = str(pathcase.canonical(path))
    anchor = Path(real)
    tail: list[str] = []
    while True:
        try:
            st = os.stat(anchor)
            break
        except (FileNotFoundError, NotADirectoryError):
            if anchor.parent == anchor:
                raise
            # Not mutated: one fixed order per length: equal tails stay equal.
            tail.insert(0, anchor.name)  # pragma: no mutate
            anchor = anchor.parent
    if tail and pathcase.case_insensitive(anchor):
        # Names not made yet: `Fix` and `fix` would be one directory there.
        tail = [pathcase.fold(name) for name in tail]
    return DirKey(real, (st.st_dev, st.st_ino, "/".join(tail)))


class DirectoryExclusion:
    # Not mutated: every construction passes wait_s.
    def __init__(self, *, wait_s: float = 30.0) -> None:  # pragma: no mutate
        self.wait_s = wait_s
        # Not mutated: tokens are dict keys only: any start is distinct.
        self._tokens = itertools.count(1)  # pragma: no mutate
        self._dirs: dict[int, DirKey] = {}
        self._dirs_changed = anyio.Event()

    @asynccontextmanager
    async def directory(
        self, path: Path | str, *, timeout: float | None = None, label: str = ""
    ) -> AsyncIterator[DirKey]:
        """Exclusive use of one directory, whatever spelling reached it (bounded wait)."""
        wait_s = self.wait_s if timeout is None else timeout
        key = dir_key(path)
        if any(key.conflicts(other) for other in self._dirs.values()):
            # Said once per wait: who waits on a directory is otherwise invisible.
            log.info("coordinator.directory_waiting", path=key.realpath, label=label)
        with anyio.move_on_after(wait_s) as scope:
            while any(key.conflicts(other) for other in self._dirs.values()):
                await self._dirs_changed.wait()
        if scope.cancelled_caught:
            raise XumError(
                ErrorKind.TIMEOUT,
                f"timed out after {wait_s}s waiting for another operation on {key.realpath}",
                waited_for=f"directory {key.realpath}",
            )
        token = next(self._tokens)
        self._dirs[token] = key
        log.debug("coordinator.directory_acquired", path=key.realpath, label=label)
        try:
            yield key
        finally:
            del self._dirs[token]
            self._dirs_changed.set()
            self._dirs_changed = anyio.Event()

    def held(self) -> list[str]:
        """The directories held now (for `daemon.status`)."""
        return sorted(k.realpath for k in self._dirs.values())
