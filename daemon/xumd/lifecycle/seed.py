"""Ignored files of the main checkout copied into a new checkout.

Which: untracked files and directories of the project's main checkout that match the project's
`[create] copy` patterns or its `.worktreeinclude` (gitignore syntax) AND that the repository
ignores. Git does the matching (`ls-files --others --ignored --exclude-from`, then
`check-ignore`), so the patterns mean exactly what they mean in a .gitignore.

How: by file descriptor through system/fscopy.py: each path component is opened with
O_NOFOLLOW (a symlink in the path is never followed, in the source or in the new checkout), a
symlink is copied as a link, special files are skipped, a directory on another mount is not
entered, data is cloned (FICLONE) where the filesystem can and copied otherwise. An entry the
new checkout already has (a tracked file on the branch; at unarchive, what the snapshot or the
archive's preserved files restored) is left as it is.

Bounded: the whole copy is sized first; entries beyond `[create] copy_max_bytes` (ROOT/config.toml)
are skipped whole (never half a directory) and reported (`capped`); space is checked before
anything is written; the copy runs in a worker thread under `copy_timeout_s`, and stops at the
next file (or the next 8 MiB of a large one) when the deadline passes or the daemon stops. A
copy that fails raises: the caller (create, unarchive) undoes the checkout, so a half-seeded
workspace is never reported as made.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.wsenv import CopyReport

from xumd.base import logs
from xumd.base.errors import XumError
from xumd.system import diskfull, fscopy, walk
from xumd.system.git import _BASE_ENV, Git
from xumd.system.procutil import CommandNotFound, run_command

log = logs.get("xumd.lifecycle.seed")

LIST_LIMIT = 8 << 20
"""Bytes of NUL-separated paths git may list; more is refused (narrow the patterns)."""
SHOWN = 1000
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Stopped(Exception):
    """The copy's deadline passed, or the daemon is stopping."""


@dataclass
class _Planned:
    entry: str
    allocated: int
    entries: int
    merge: bool = False
    """A directory the new checkout has already (at unarchive: one holding restored or
    preserved files): what it lacks is copied into it, nothing in it is replaced."""


@dataclass
class _Plan:
    todo: list[_Planned] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)


async def git_list(
    git: Git,
    repo: Path,
    args: list[str],
    stdin: bytes | None = None,
    *,
    what: str = "the ignored files to copy",
    too_many: str = "narrow [create] copy / .worktreeinclude (a directory pattern copies a "
    "directory as one entry)",
    limit: int = LIST_LIMIT,
) -> list[str]:
    """The NUL-separated paths a git command prints on stdout, all of them or an error:
    `Git.run`'s output keeps a head and a tail and drops the middle (64 KiB), which would
    silently lose entries of a long listing. Git's stderr (`warning: could not open directory
    ...`) goes to a file of its own and is only ever quoted in an error, never read as a path."""
    with tempfile.TemporaryFile(prefix="xum-git-stderr-") as errors:
        try:
            result = await run_command(
                [git.binary, "-C", str(repo), *args],
                env={**os.environ, **_BASE_ENV},
                timeout_s=git.timeout_s,
                output_limit=limit,
                stdin=stdin,
                containment=git.containment,
                stderr_fd=errors.fileno(),
            )
        except CommandNotFound as exc:
            raise XumError(ErrorKind.OPERATION_FAILED, f"git is not installed ({exc})") from None
        errors.seek(max(0, os.fstat(errors.fileno()).st_size - 800))
        said = errors.read(800).decode("utf-8", "replace").strip()
    # check-ignore exits 1 when nothing is ignored: not a failure.
    if result.timed_out or result.returncode not in (0, 1):
        raise XumError(
            ErrorKind.TIMEOUT if result.timed_out else ErrorKind.OPERATION_FAILED,
            f"listing {what} failed: git {args[0]}: {result.describe()}: {said}",
        )
    if result.output.dropped:
        raise XumError(
            ErrorKind.OPERATION_FAILED,
            f"{what} take more than {limit} bytes to list; {too_many}",
        )
    return [p for p in result.output.text().split("\0") if p]


async def matching(git: Git, repo: Path, patterns: list[str]) -> list[str]:
    """The untracked, ignored entries of `repo` that match `patterns` (directories end in '/':
    one entry for a directory wholly matched and ignored)."""
    if not patterns:
        return []
    # On the command line (no file to write: a full /tmp must not stop a create); git reads
    # each `--exclude` as one .gitignore line, in order.
    listing = ["ls-files", "-z", "--others", "--ignored", *(f"--exclude={p}" for p in patterns)]
    found = await git_list(git, repo, [*listing, "--directory"])
    if not found:
        return []
    ignored = set(await _ignored(git, repo, found))
    # A listed directory the repository does not ignore as a whole (`build/` where only
    # `build/*.o` is ignored): its own matching files, each checked.
    partial = [e for e in found if e.endswith("/") and e not in ignored]
    if partial:
        inside = await git_list(git, repo, [*listing, "--", *partial])
        ignored.update(await _ignored(git, repo, inside))
    chosen = sorted(ignored)
    dirs = [e for e in chosen if e.endswith("/")]
    return [e for e in chosen if not any(e != d and e.startswith(d) for d in dirs)]


async def _ignored(git: Git, repo: Path, paths: list[str]) -> list[str]:
    if not paths:
        return []
    stdin = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
    return await git_list(git, repo, ["check-ignore", "-z", "--stdin"], stdin)


_LINKED = "a symlink on its path in the new checkout: not followed"


def _at_dest(dest_fd: int, parts: list[str]) -> str:
    """Whether the entry is `absent` from the new checkout, `exists` there, or sits behind a
    symlink there (`linked`: the branch may track `sub` as a link where the main checkout has
    a directory; writing through it would write outside the checkout)."""
    try:
        parent = fscopy.open_parents(dest_fd, parts)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return "absent"
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return "linked"
        raise
    try:
        st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return "absent"
    finally:
        os.close(parent)
    return "dir" if stat.S_ISDIR(st.st_mode) else "exists"


def _plan(src: Path, dest: Path, entries: list[str], cap: int, check: fscopy.Skip) -> _Plan:
    plan = _Plan()
    total = 0
    root_fd = os.open(src, _DIR_FLAGS)
    dest_fd = os.open(dest, _DIR_FLAGS)
    try:
        top = walk.mount_identity(root_fd)
        for entry in entries:
            parts = entry.rstrip("/").split("/")
            there = _at_dest(dest_fd, parts)
            if there == "exists" or (there == "dir" and not entry.endswith("/")):
                # Left as it is: neither sized against the cap nor counted for space.
                plan.existing.append(entry)
                continue
            if there == "linked":
                plan.refused.append(f"{entry} ({_LINKED})")
                continue
            try:
                parent = fscopy.open_parents(root_fd, parts)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    plan.refused.append(f"{entry} (a symlink on its path: not followed)")
                    continue
                if exc.errno == errno.ENOENT:
                    continue  # gone since git listed it
                raise
            try:
                if fscopy.other_mount(parent, top):
                    plan.mounts.append(entry)
                    continue
                if plan.skipped:  # past the cap: skipped without walking it to size it
                    plan.skipped.append(entry)
                    continue
                try:
                    size = fscopy.tally_at(parent, parts[-1], check, rel="/".join(parts))
                except FileNotFoundError:
                    continue
            finally:
                os.close(parent)
            if total + size.allocated > cap:
                plan.skipped.append(entry)  # the copy stops at the cap: this and the rest
                continue
            total += size.allocated
            plan.todo.append(_Planned(entry, size.allocated, size.entries, merge=there == "dir"))
    finally:
        os.close(root_fd)
        os.close(dest_fd)
    return plan


def _copy(src: Path, dest: Path, plan: _Plan, check: fscopy.Skip) -> fscopy.Tally:
    report = fscopy.Tally(between=lambda: check(""))
    if not plan.todo:
        return report
    fscopy.check_space(
        dest,
        sum(p.allocated for p in plan.todo),
        sum(p.entries for p in plan.todo) + 1,
        f"the ignored files to copy into {dest}",
    )
    src_fd = os.open(src, _DIR_FLAGS)
    dest_fd = os.open(dest, _DIR_FLAGS)
    try:
        for item in plan.todo:
            parts = item.entry.rstrip("/").split("/")
            try:
                sdir = fscopy.open_parents(src_fd, parts)
                try:
                    os.stat(parts[-1], dir_fd=sdir, follow_symlinks=False)
                except BaseException:
                    os.close(sdir)
                    raise
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped for a link since
                    plan.refused.append(f"{item.entry} (a symlink on its path: not followed)")
                    continue
                if exc.errno == errno.ENOENT:
                    # Deleted from the main checkout since it was sized (an `npm ci` there):
                    # nothing to copy, not a failure.
                    plan.vanished.append(item.entry)
                    continue
                raise
            try:
                mode = stat.S_IMODE(os.fstat(sdir).st_mode) or 0o755
                try:
                    ddir = fscopy.open_parents(dest_fd, parts, create_like=mode)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        plan.refused.append(f"{item.entry} ({_LINKED})")
                        continue
                    raise
                try:
                    if item.merge:
                        if fscopy.merge_dir_at(
                            sdir,
                            ddir,
                            parts[-1],
                            item.entry.rstrip("/"),
                            skip=_merging(dest, check),
                            report=report,
                        ):
                            plan.done.append(item.entry)
                        continue
                    try:
                        os.stat(parts[-1], dir_fd=ddir, follow_symlinks=False)
                        plan.existing.append(item.entry)  # made meanwhile
                        continue
                    except FileNotFoundError:
                        pass
                    try:
                        wrote = fscopy.copy_entry_at(
                            sdir, ddir, parts[-1], item.entry.rstrip("/"), skip=check, report=report
                        )
                    except BaseException:
                        fscopy.remove_partial(dest / item.entry.rstrip("/"))
                        raise
                    if wrote:  # else a special file or a mount: reported as such, not copied
                        plan.done.append(item.entry)
                finally:
                    os.close(ddir)
            finally:
                os.close(sdir)
    finally:
        os.close(src_fd)
        os.close(dest_fd)
    return report


def _merging(dest: Path, check: fscopy.Skip) -> fscopy.Skip:
    """Leave out what the checkout has already, except directories (they merge)."""

    def skip(rel: str) -> bool:
        check(rel)
        try:
            st = os.lstat(dest / rel)
        except FileNotFoundError:
            return False
        return not stat.S_ISDIR(st.st_mode)

    return skip


def _shown(items: list[str]) -> list[str]:
    return items[:SHOWN]


async def seed(
    git: Git,
    src: Path,
    dest: Path,
    patterns: list[str],
    *,
    cap: int,
    timeout_s: float,
    stopping: Callable[[], bool],
) -> CopyReport:
    """Copy the matching ignored entries of `src` (the main checkout) into `dest`."""
    started = time.monotonic()
    entries = await matching(git, src, patterns)
    if not entries:
        return CopyReport(status="none", limit_bytes=cap)
    deadline = started + timeout_s

    def check(_rel: str) -> bool:
        if time.monotonic() > deadline or stopping():
            raise Stopped
        return False

    try:
        plan = await anyio.to_thread.run_sync(_plan, src, dest, entries, cap, check)
        tally = await anyio.to_thread.run_sync(_copy, src, dest, plan, check)
    except Stopped:
        why = "the daemon is stopping" if stopping() else f"it took longer than {timeout_s}s"
        raise XumError(
            ErrorKind.TIMEOUT if not stopping() else ErrorKind.SHUTTING_DOWN,
            f"copying ignored files into {dest} was stopped: {why} "
            "([create] copy_timeout_s in ROOT/config.toml)",
            waited_for="the copy of ignored files",
        ) from None
    except OSError as exc:
        if diskfull.is_no_space_oserror(exc):
            raise diskfull.from_oserror(exc, str(dest)) from None
        raise XumError(
            ErrorKind.OPERATION_FAILED, f"copying ignored files into {dest} failed: {exc}"
        ) from None
    elapsed = time.monotonic() - started
    files = len(tally.files)
    report = CopyReport(
        status="capped" if plan.skipped else ("ok" if plan.todo else "none"),
        paths=_shown(plan.done),
        files=files,
        bytes=tally.allocated,
        cloned=tally.cloned,
        copied=files - tally.cloned,
        elapsed_s=round(elapsed, 3),
        skipped=_shown(plan.skipped),
        existing=_shown(plan.existing),
        special=_shown([f"{s.path} ({s.type})" for s in tally.special] + plan.refused),
        mounts=_shown(plan.mounts + tally.mounts),
        limit_bytes=cap,
    )
    log.info(
        "workspace.ignored_copied",
        dest=str(dest),
        status=report.status,
        files=report.files,
        bytes=report.bytes,
        cloned=report.cloned,
        elapsed_s=report.elapsed_s,
    )
    return report
