"""The one walk of a directory tree by file descriptor, for every part that walks a checkout:
the deletion (fsdelete), the copies and their size counts (fscopy, rawcopy), the usage walk,
the ignored files an archive drops and its special-file report (snapshot), the proof on the
bytes (onbytes).

What holds for every caller:

- Every directory is opened relative to its parent (`openat` with O_NOFOLLOW | O_DIRECTORY)
  and every entry is looked at with `fstatat` on its own name: a symlink is never followed, and
  no path longer than one name is ever opened, so a tree deeper than PATH_MAX is walked whole.
- The walk is a loop over a stack of frames, never a recursion: depth has no limit but the
  filesystem's. At most `WINDOW` directory descriptors are held along the path; deeper
  ancestors are closed and reopened through `..` on the way back, checked by identity
  (st_dev, st_ino): one moved meanwhile is `Moved`, and nothing more is walked.
- A directory on another mount than the top is never entered: another `st_dev`, another
  inode than its parent's listing names (a bind mount of the same filesystem keeps `st_dev`
  but covers a directory; the mount ids settle it, where the platform has them), or (with
  `Policy.mount_ids`) another mount id (/proc/self/fdinfo). It is handed to the caller as a
  `MOUNT` step, checked on the opened directory itself, so a mount made after the caller read
  the mount table is caught.
- A directory swapped for a link or a file between its `lstat` and its `open` is looked at
  again (as what it is now), never followed.
- An error names its entry by the path relative to the top (`named`), or goes to the
  caller's `Policy.errors`, which reports it and lets the walk go on.

What differs per caller is its `Policy` (order, what is looked at, which mount test, what an
error does) and what its loop does with each step: a special file is an `ENTRY` like any other
(the walk never opens one), to skip or report; a `MOUNT` step is to stop at, refuse or report.
"""

from __future__ import annotations

import copy
import errno
import os
import stat
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass
from operator import attrgetter
from typing import cast

from xumd.system.platform import current

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NAME = attrgetter("name")

WINDOW = 64
"""Directory descriptors held open along the walk's path (the top's included), so a tree
thousands of levels deep never runs the process out of descriptors."""

ENTRY = "entry"
"""An entry of a directory; a directory is already opened (`Step.fd`) and on the top's mount."""
MOUNT = "mount"
"""A directory on another mount (or one the opener refused as `OtherMount`): not entered."""
LISTED = "listed"
"""A directory's listing (`Policy.listings`), before any of its entries is walked."""
LEAVE = "leave"
"""A directory whose entries are all walked (`Policy.leave`); `Step.dir_fd` is its parent."""


class Moved(OSError):
    """A directory of the walk was moved out from under it; nothing more is walked."""


class OtherMount(Exception):
    """Raised by a `Policy.open` to say the directory is not the walk's to enter."""


_NAMED = "xum_walk_path"


def named(exc: OSError, path: str) -> OSError:
    """`exc` as an error naming `path` (relative to the walk's top: `build/out.o`) and its
    reason. A descriptor call (`unlinkat`, `openat`) knows only the entry's own name, so its
    error says `Permission denied: 'out.o'`; the walk knows where that entry is. Same class and
    errno (callers still tell ENOENT or ENOSPC apart); one already named by an inner walk, or a
    `Moved` (it names its directory), keeps what it says. Always a new exception, for the
    caller to raise `from exc`."""
    if getattr(exc, _NAMED, None) is not None or isinstance(exc, Moved):
        return copy.copy(exc)
    if exc.errno is not None:
        try:
            new = type(exc)(exc.errno, exc.strerror or os.strerror(exc.errno), path)
        except TypeError:
            new = OSError(exc.errno, exc.strerror or os.strerror(exc.errno), path)
    else:
        new = OSError(f"{path}: {exc}")
    setattr(new, _NAMED, path)
    return new


def mount_id(fd: int) -> int | None:
    """The mount id of an open file (Linux: `mnt_id` in /proc/self/fdinfo); None where unknown
    (the portable backend has none)."""
    return current().mount_id(fd)


def mount_identity(fd: int) -> tuple[int, int | None]:
    """(st_dev, mount id) of an open file: two directories are on one mount when these agree
    (`st_dev` alone cannot tell: two bind mounts of one filesystem share it)."""
    return os.fstat(fd).st_dev, mount_id(fd)


def open_dir(name: str, dir_fd: int) -> int:
    """The walk's default opener: the subdirectory `name`, never through a symlink."""
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


@dataclass(frozen=True, slots=True)
class Policy:
    """How one caller walks. The defaults: every entry `lstat`ed, names in order, the mount
    id read for every directory, errors raised naming their path."""

    sort: bool = True
    """Entries in name order (a reproducible report); False, in the order the directory lists
    them (a deletion, where the order is nobody's concern)."""
    files_first: bool = False
    """Each directory's files, links and special files before its subdirectories (as os.walk
    hands them over): a hard link is then counted at the name a directory-by-directory walk
    meets first."""
    stat: bool = True
    """`Step.st` is every entry's lstat; False, the listing's entry types (d_type) answer what
    kind an entry is and `Step.lstat()` stats only what the caller asks about."""
    files: bool = True
    """An ENTRY step for each entry that is not a directory; False, the caller reads those
    from the LISTED step (`listings` must be on) and the walk's own loop goes over
    directories only: for a walk whose work per file is a lookup in its listing (the proof,
    the special-file report: a step per file would cost them half again their listing)."""
    mount_ids: bool = True
    """Compare each directory's mount id with the top's (one /proc read per directory); False,
    `st_dev` only: for a caller whose mount table shows no mount below the top."""
    leave: bool = False
    """A `LEAVE` step after each directory's entries (post-order: a deletion removes the
    emptied directory then, a copy sets its mode and times)."""
    listings: bool = False
    """A `LISTED` step with each directory's listing; the caller may empty it (nothing under
    that directory is walked)."""
    skip: Callable[[str], bool] | None = None
    """Called with each entry's path relative to the top; True leaves it (and what is under
    it), unlooked at."""
    leave_out: Container[str] = frozenset()
    """Paths relative to the top to leave, unlooked at, with what is under them: `skip` as a
    set, for a caller with many (the proof's ignored paths: a lookup, not a call, per entry)."""
    errors: Callable[[str, OSError], None] | None = None
    """None: an error raises, naming its path (`prefix` + relative). Otherwise it is handed
    here with the entry's relative path and the walk goes on without that entry (a usage walk
    skips it, the proof records it as unproven). A gone entry (ENOENT) is never an error."""
    prefix: str = ""
    """Put before a relative path in a raised error's name (an inner walk of a caller's
    entry)."""
    open: Callable[[str, int], int] = open_dir
    """Opens a subdirectory by name relative to its parent's descriptor, never following a
    link (a deletion makes an unreadable one readable first); may raise `OtherMount`."""
    prepare: Callable[[int], object] | None = None
    """Called with each opened directory (the top's too) before it is listed."""


class Step:
    """One thing the walk hands its caller (`kind`: ENTRY, MOUNT, LISTED or LEAVE)."""

    __slots__ = (
        "dir_fd",
        "dirs",
        "enter",
        "entries",
        "entry",
        "fd",
        "held",
        "kind",
        "name",
        "rel",
        "st",
    )
    enter: bool
    held: bool
    entries: list[os.DirEntry[str]]
    dirs: list[os.DirEntry[str]] | None

    def __init__(  # noqa: PLR0917 - the walk's one record, built in one place per kind
        self,
        kind: str,
        dir_fd: int,
        name: str,
        rel: str,
        entry: os.DirEntry[str] | None = None,
        st: os.stat_result | None = None,
        fd: int | None = None,
    ) -> None:
        self.kind = kind
        self.dir_fd = dir_fd
        """The open directory holding the entry (for LISTED: the listed directory itself)."""
        self.name = name
        self.rel = rel
        """The entry's path relative to the top ("" for the top)."""
        self.entry = entry
        self.st = st
        self.fd = fd
        """ENTRY of a directory: the directory, opened; the walk closes it."""
        # Set only on the steps they are about (a step per entry: each assignment counts):
        # `enter` (ENTRY of a directory: set False to leave what is under it unwalked),
        # `held` (LEAVE: something under the directory was not entered, a MOUNT, or `hold()`),
        # `entries` (LISTED: the fresh listing, the entries still to walk, in no particular
        # order; the caller may remove some or clear it: those are not walked), `dirs` (LISTED
        # with `files` off: None, or the listing's directories the caller sorted out while
        # reading it: the walk goes into those, and spares itself a second pass).

    def lstat(self) -> os.stat_result:
        if self.st is None:
            if self.entry is not None:
                self.st = self.entry.stat(follow_symlinks=False)
            else:
                self.st = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
        return self.st

    def is_dir(self) -> bool:
        if self.st is None and self.entry is not None:
            return self.entry.is_dir(follow_symlinks=False)
        return stat.S_ISDIR(self.lstat().st_mode)

    def is_symlink(self) -> bool:
        if self.st is None and self.entry is not None:
            return self.entry.is_symlink()
        return stat.S_ISLNK(self.lstat().st_mode)

    def is_file(self) -> bool:
        """A regular file (never through a link)."""
        if self.st is None and self.entry is not None:
            return self.entry.is_file(follow_symlinks=False)
        return stat.S_ISREG(self.lstat().st_mode)


def _not_a_directory(entry: os.DirEntry[str] | str) -> bool:
    return isinstance(entry, str) or not entry.is_dir(follow_symlinks=False)


@dataclass(slots=True)
class _Frame:
    fd: int | None
    ident: tuple[int, int]
    rel: str
    base: str
    """`rel` and a slash: what an entry's name is put after ("" at the top)."""
    name: str
    pending: list[os.DirEntry[str] | str]
    held_before: int


class Walk:
    """The steps of a walk of the open directory `top_fd` (the caller's to close; never
    yielded itself), parents before what they hold. Iterate once."""

    def __init__(self, top_fd: int, policy: Policy | None = None) -> None:
        self.policy = policy or Policy()
        self.top_fd = top_fd
        st = os.fstat(top_fd)
        self.dev = st.st_dev
        self.mount = mount_id(top_fd) if self.policy.mount_ids else None
        self._top_mount_read = self.policy.mount_ids
        self._ident = (st.st_dev, st.st_ino)
        self._frames: list[_Frame] = []
        self._held = 0

    def again(self, name: str) -> None:
        """Look at the entry `name` of the current directory once more (after an ENTRY step
        the caller found changed meanwhile: a file swapped for a directory)."""
        self._frames[-1].pending.append(name)

    def hold(self) -> None:
        """Mark the directories along the current path as holding something left alone (their
        LEAVE steps say `held`)."""
        self._held += 1

    def _failed(self, rel: str, exc: OSError) -> None:
        handler = self.policy.errors
        if handler is None:
            raise named(exc, self.policy.prefix + rel) from exc
        handler(rel, exc)

    def _list(self, fd: int) -> list[os.DirEntry[str] | str]:
        if self.policy.prepare is not None:
            self.policy.prepare(fd)
        with os.scandir(fd) as it:
            # Reversed: entries are popped from the end (a pop(0) would be quadratic).
            entries: list[os.DirEntry[str] | str] = (
                sorted(it, key=_NAME, reverse=True) if self.policy.sort else list(it)
            )
        if self.policy.files_first:
            entries.sort(key=_not_a_directory)  # stable: the name order stays within each
        return entries

    def __iter__(self) -> Iterator[Step]:
        policy = self.policy
        try:
            pending = self._list(self.top_fd)
        except OSError as exc:
            if policy.errors is None:
                raise
            policy.errors("", exc)
            return
        frames = self._frames
        frames.append(_Frame(self.top_fd, self._ident, "", "", "", pending, 0))
        skip, want_stat, leave_out = policy.skip, policy.stat, policy.leave_out
        listings, files = policy.listings, policy.files
        # One generator, its helpers plain calls: a step costs one resume, not one per level.
        try:
            if listings:
                listed = _listed(self.top_fd, "", "", pending)
                yield listed
                if not files:
                    _only_directories(listed, pending)
            while frames:
                frame = frames[-1]
                pending, dir_fd, base = frame.pending, frame.fd, frame.base
                assert dir_fd is not None
                # Not mutated (each `continue` below): a `break` would end this loop without its
                # `else`, and the loop around it starts it again on the same frame and pending list.
                while pending:
                    item = pending.pop()
                    if isinstance(item, str):
                        name, entry = item, None
                    else:
                        name, entry = item.name, item
                    rel = base + name
                    if rel in leave_out or (skip is not None and skip(rel)):
                        continue  # pragma: no mutate
                    st: os.stat_result | None = None
                    if want_stat or entry is None:
                        try:
                            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                        except FileNotFoundError:
                            continue  # gone since the listing  # pragma: no mutate
                        except OSError as exc:
                            self._failed(rel, exc)
                            continue  # pragma: no mutate
                        entry = None
                        if not stat.S_ISDIR(st.st_mode):
                            yield Step(ENTRY, dir_fd, name, rel, None, st)
                            continue  # pragma: no mutate
                    elif not entry.is_dir(follow_symlinks=False):
                        yield Step(ENTRY, dir_fd, name, rel, entry)
                        continue  # pragma: no mutate
                    opened = self._open(frame, name, rel, None if isinstance(item, str) else item)
                    if opened is None:
                        continue  # pragma: no mutate
                    sub, ident = opened
                    if sub < 0:
                        yield Step(MOUNT, dir_fd, name, rel, entry, st)
                        continue  # pragma: no mutate
                    step = Step(ENTRY, dir_fd, name, rel, entry, st, sub)
                    step.enter = True
                    try:
                        yield step
                    except BaseException:
                        os.close(sub)
                        raise
                    if not step.enter:
                        os.close(sub)
                        continue  # pragma: no mutate
                    below = self._push(sub, ident, name, rel)
                    if below is None:
                        continue  # pragma: no mutate
                    if listings:
                        listed = _listed(sub, name, rel, below)
                        yield listed
                        if not files:
                            _only_directories(listed, below)
                    break  # on with the new frame
                else:
                    if len(frames) == 1:
                        return
                    leave = self._pop(policy.leave)
                    if leave is False:
                        return
                    if leave is not True:
                        yield leave
        finally:
            for frame in frames[1:]:
                if frame.fd is not None:
                    os.close(frame.fd)
            frames.clear()

    def _top_mount(self) -> int | None:
        """The top's mount id, read once when first needed (None: the platform has none)."""
        if not self._top_mount_read:
            self.mount = mount_id(self.top_fd)
            self._top_mount_read = True  # pragma: no mutate (a cache: the same id read again)
        return self.mount

    def _open(
        self, frame: _Frame, name: str, rel: str, listed: os.DirEntry[str] | None
    ) -> tuple[int, tuple[int, int]] | None:
        """The subdirectory `name` of `frame`, opened, and its identity; -1 for one on another
        mount; None when there is nothing to walk (gone, swapped and to look at again, an
        error the caller's `errors` took).

        A mount of the same filesystem (a bind mount, made before the walk or during it) keeps
        `st_dev`. Every directory is also checked by its listing's inode, which costs no call:
        the parent's entry names the directory a mount covers, the open reaches the mount's
        root, and the two differ. A difference is then settled by the mount ids (a filesystem
        whose listing inodes differ from its stat ones, as overlayfs without `xino` on layers
        of several filesystems, is walked all the same); where the platform has none, the
        directory is not entered (left in place as a mount: a directory swapped between the
        listing and the open is treated so too)."""
        dir_fd = frame.fd
        assert dir_fd is not None
        try:
            sub = self.policy.open(name, dir_fd)
        except OtherMount:
            self._held += 1
            return -1, (0, 0)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                frame.pending.append(name)  # swapped for a link or a file: look again
                return None
            self._failed(rel, exc)
            return None
        try:
            st = os.fstat(sub)
            other = st.st_dev != self.dev
            if other:
                pass
            elif listed is not None and listed.inode() != st.st_ino:
                other = self._top_mount() is None or mount_id(sub) != self._top_mount()
            elif self.policy.mount_ids:
                other = self.mount is not None and mount_id(sub) != self.mount
        except BaseException:
            os.close(sub)
            raise
        if other:
            os.close(sub)
            self._held += 1
            return -1, (0, 0)
        return sub, (st.st_dev, st.st_ino)

    def _push(
        self, sub: int, ident: tuple[int, int], name: str, rel: str
    ) -> list[os.DirEntry[str] | str] | None:
        """List the opened directory `sub` and make it the current frame (its listing; None
        when it could not be listed and the caller's `errors` took that)."""
        try:
            pending = self._list(sub)
        except OSError as exc:
            os.close(sub)
            self._failed(rel, exc)
            return None
        except BaseException:
            os.close(sub)
            raise
        frames = self._frames
        frames.append(_Frame(sub, ident, rel, rel + "/", name, pending, self._held))
        oldest = frames[len(frames) - WINDOW] if len(frames) > WINDOW else None
        if oldest is not None and oldest.fd is not None:
            os.close(oldest.fd)
            oldest.fd = None
        return pending

    def _pop(self, leave: bool) -> Step | bool:
        """Close the current frame, its parent open again: its LEAVE step (with `leave`), True
        (without), or False when the parent was moved and the caller's `errors` took that."""
        frames = self._frames
        frame = frames.pop()
        parent = frames[-1]
        if parent.fd is None:
            try:
                self._reopen(parent, frame)
            except Moved as exc:
                if self.policy.errors is None:
                    raise
                self.policy.errors(parent.rel, exc)
                return False
        assert parent.fd is not None and frame.fd is not None
        os.close(frame.fd)
        frame.fd = None
        if not leave:
            return True
        step = Step(LEAVE, parent.fd, frame.name, frame.rel)
        step.held = self._held > frame.held_before
        return step

    def _reopen(self, parent: _Frame, child: _Frame) -> None:
        """Open `parent` again through `..` of its child, as the same directory."""
        assert child.fd is not None
        try:
            fd = os.open("..", _DIR_FLAGS, dir_fd=child.fd)
        except OSError as exc:
            raise named(exc, self.policy.prefix + parent.rel) from exc
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != parent.ident:
            os.close(fd)
            raise Moved(errno.ESTALE, f"{self.policy.prefix}{parent.rel} was moved during the walk")
        parent.fd = fd
        # A listing's entries would look up their type through the descriptor they were
        # listed with, which is closed: from here on they are looked up by name.
        parent.pending = [e if isinstance(e, str) else e.name for e in parent.pending]


def _listed(fd: int, name: str, rel: str, pending: list[os.DirEntry[str] | str]) -> Step:
    step = Step(LISTED, fd, name, rel)
    # A fresh listing: DirEntry only (a name is put back only later, by `again` or a reopen).
    step.entries = cast("list[os.DirEntry[str]]", pending)
    step.dirs = None
    return step


def _only_directories(listed: Step, pending: list[os.DirEntry[str] | str]) -> None:
    """Keep, of a listing the caller has read, what the walk goes into."""
    if listed.dirs is not None:
        pending[:] = listed.dirs
    else:
        pending[:] = [e for e in listed.entries if e.is_dir(follow_symlinks=False)]
