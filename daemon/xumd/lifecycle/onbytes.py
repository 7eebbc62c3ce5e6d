"""The proof that nothing is lost, made on the bytes on disk, not on git's view of them.

A snapshot (lifecycle/snapshot.py) is git's view of a checkout, and git does not see everything:
a nested repository is one gitlink (its files and its own `.git` are not in the tree), a file
marked `--assume-unchanged` or `--skip-worktree` keeps its index blob however it was edited,
a clean filter (`text`, `eol`, `filter`, `ident`, `working-tree-encoding`) stores other bytes
than the file holds and a smudge writes others again, an empty directory is nothing to git,
and a path deeper than PATH_MAX is never opened by it.

So before a checkout goes, `account` walks it by descriptor (every path one name deep, so a
tree deeper than PATH_MAX is walked whole) and puts every entry that is not ignored in one of
three places:

- reproduced: what unarchive writes from the snapshot's tree (or HEAD's, for a clean checkout)
  gives it back byte for byte, mode (the executable bit, a link) included;
- `raw`: saved as it is in the archive store (`save`) and written back over the restored
  checkout (`place`);
- `unproven`: it cannot be read, so nothing can be proven: the caller refuses `not_safe`
  naming it.

Which entries are compared byte by byte: a file git's `add` did not look at (flagged in the
index), a file whose attributes convert it (its expected bytes are what `checkout-index` writes
for it, in a scratch directory), every file when `core.fileMode` is false (the executable bit),
a symlink when git keeps links as files. Any other file that is in the tree, as the same kind
of entry, was read by git's own `add -A`, which re-hashes every file whose stat data moved
(racily clean ones included): that is git comparing bytes, and it costs one directory listing
per directory here instead of a read of every file (docs/PERFORMANCE.md, "The proof on the
bytes").

Ignored entries are not the checkout's work (the `dropped` report and `preserve` cover them);
special files hold no bytes (`dropped.special`); another mount is not entered (it is no part of
the checkout: the quiescence checks refuse what sits on one).
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from xum_protocol.errors import ErrorKind

from xumd.base import logs
from xumd.base.errors import XumError
from xumd.lifecycle.rows import WorkspaceRow
from xumd.lifecycle.seed import git_list
from xumd.system import fsdelete, rawcopy
from xumd.system import walk as treewalk
from xumd.system.git import Git

log = logs.get("xumd.lifecycle.onbytes")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_CHUNK = 1 << 20
TREE_LIMIT = 256 << 20
"""Bytes of `ls-tree` / `ls-files` output read whole (a 100,000-file tree is about 10 MiB)."""

NESTED = "nested_repository"
FLAGGED = "index_flag"
FILTERED = "content_filter"
UNSEEN = "outside_git_view"
MODE = "mode"
EMPTY_DIR = "empty_directory"

ASSUME_UNCHANGED = "assume_unchanged"
SKIP_WORKTREE = "skip_worktree"

_CONVERTING = ("filter", "ident", "working-tree-encoding")
_ATTRS = ("text", "eol", "crlf", *_CONVERTING)


@dataclass(frozen=True, slots=True)
class RawEntry:
    path: str
    """Relative to the checkout: a file, a link, or a directory saved whole."""
    why: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "why": self.why}


@dataclass(slots=True)
class Account:
    raw: list[RawEntry] = field(default_factory=list)
    unproven: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason) of entries that could not be read: nothing about them is proven."""
    submodules: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason) of submodules a restore would not give back as they are: their git
    directory goes with the checkout's admin directory, so they cannot be kept whole."""
    flags: dict[str, str] = field(default_factory=dict)
    """The index flags of the files on disk (path -> ASSUME_UNCHANGED or SKIP_WORKTREE): the
    user's choice, set again by unarchive (`reflag`)."""
    walked: int = 0
    ignored: list[str] | None = None
    """Git's ignored listing the account was made with (reused for the `dropped` report)."""

    def held_back(self, force: bool) -> list[tuple[str, str]]:
        """What refuses the deletion: unreadable entries always; submodules with work unless
        `force`, which keeps their files as they are (`raw`) instead."""
        if force:
            self.raw.extend(RawEntry(p, NESTED) for p, _why in self.submodules)
            self.submodules = []
            self.raw.sort(key=lambda r: r.path)
            return list(self.unproven)
        return self.unproven + self.submodules


@dataclass(frozen=True, slots=True)
class _Settings:
    object_format: str
    autocrlf: str
    eol: str
    filemode: bool
    symlinks: bool
    attributes: bool
    """Whether any attributes file could apply (in the tree, info/, global, system)."""


@dataclass(slots=True)
class _Walk:
    account: Account
    tree: dict[str, tuple[str, str]]
    flagged: dict[str, str]
    """path -> ASSUME_UNCHANGED or SKIP_WORKTREE, for every flagged index entry."""
    convert: dict[str, str]
    """path -> "hash" (checkout writes the blob as it is; the clean side may alter it) or
    "predict" (checkout converts: compare with what checkout-index writes)."""
    ignored_files: set[str]
    ignored_dirs: set[str]
    settings: _Settings
    predict: list[tuple[str, str]] = field(default_factory=list)
    """(path, why) of files to compare with what checkout-index writes for them."""
    submodules: list[tuple[str, str]] = field(default_factory=list)
    """(path, gitlink commit) of registered submodules (a `.git` file at a gitlink)."""


def refuse_unproven(row: WorkspaceRow, proof: Account, what: str, force: bool = False) -> None:
    """`not_safe` naming every entry whose keeping the proof could not establish (unreadable,
    or a submodule with work of its own): the checkout is not deleted."""
    held = proof.held_back(force)
    if held:
        shown = ", ".join(f"{p} ({why})" for p, why in held[:5])
        more = f" and {len(held) - 5} more" if len(held) > 5 else ""
        raise XumError(
            ErrorKind.NOT_SAFE,
            f"cannot {what} {row.name!r}: nothing proves these entries of {row.path} would be "
            f"kept: {shown}{more}; make them readable to the daemon, commit their work, or "
            "move them away",
            unproven=[{"path": p, "reason": why} for p, why in held[:100]],
            path=str(row.path),
        )


# -- the account --------------------------------------------------------------------------------


async def account(
    git: Git,
    checkout: Path,
    tree: str,
    ignored: Iterable[str],
    main: Path | None = None,
    *,
    scratch: Path,
) -> Account:
    """Account for every entry of `checkout` that is not `ignored` (git's ignored listing:
    files, and directories ending in `/`) against `tree` (the snapshot's work tree, or HEAD's).
    `main`: the project's main checkout, whose submodules a restore initialises from.
    `scratch`: a directory of the daemon's where converted files are written to compare."""
    dirs_out = await git.out(
        checkout, "rev-parse", "--path-format=absolute", "--absolute-git-dir", "--git-common-dir"
    )
    lines = dirs_out.splitlines()
    if len(lines) != 2 or not all(os.path.isabs(line) for line in lines):
        raise XumError(
            ErrorKind.OPERATION_FAILED,
            f"git rev-parse of {checkout} gave no git directories: {dirs_out[:200]!r}",
        )
    git_dir, common = Path(lines[0]), Path(lines[1])
    settings = await _settings(git, checkout, git_dir, common)
    entries = await _tree(git, checkout, tree)
    flagged = await _flagged(git, checkout)
    in_tree = any(p == ".gitattributes" or p.endswith("/.gitattributes") for p in entries)
    converting = in_tree or settings.attributes or settings.autocrlf in ("true", "input")
    convert = await _conversions(git, checkout, entries, settings) if converting else {}
    files: set[str] = set()
    dirs: set[str] = set()
    for entry in ignored:
        (dirs if entry.endswith("/") else files).add(entry.rstrip("/"))
    walk = _Walk(Account(), entries, flagged, convert, files, dirs, settings)
    await anyio.to_thread.run_sync(_walk_checkout, checkout, walk)
    if walk.predict:
        await _compare_predicted(git, checkout, scratch, tree, walk)
    for rel, commit in walk.submodules:
        why = await _submodule_unheld(git, checkout / rel, commit, main / rel if main else None)
        if why:
            walk.account.submodules.append((rel, why))
    walk.account.raw.sort(key=lambda r: r.path)
    return walk.account


async def _settings(git: Git, checkout: Path, git_dir: Path, common: Path) -> _Settings:
    result = await git.run(
        checkout,
        "config",
        "-z",
        "--get-regexp",
        r"^(core\.(autocrlf|eol|filemode|symlinks|attributesfile)|extensions\.objectformat)$",
        check=False,
    )
    found: dict[str, str] = {}
    for item in result.output.text().split("\0") if result.ok else []:
        key, _, value = item.partition("\n")
        if key:
            found[key.lower()] = value.strip().lower() if key != "core.attributesfile" else value
    sources = [
        common / "info" / "attributes",
        git_dir / "info" / "attributes",
        Path("/etc/gitattributes"),
        Path("/usr/local/etc/gitattributes"),
    ]
    global_file = found.get("core.attributesfile")
    if global_file:
        sources.append(Path(os.path.expanduser(global_file)))
    else:
        config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
        sources.append(Path(config_home) / "git" / "attributes")
    return _Settings(
        object_format=found.get("extensions.objectformat", "sha1") or "sha1",
        autocrlf=found.get("core.autocrlf", "false"),
        eol=found.get("core.eol", ""),
        filemode=found.get("core.filemode", "true") not in ("false", "no", "off", "0"),
        symlinks=found.get("core.symlinks", "true") not in ("false", "no", "off", "0"),
        attributes=any(_nonempty(p) for p in sources),
    )


def _nonempty(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


async def _tree(git: Git, checkout: Path, tree: str) -> dict[str, tuple[str, str]]:
    """path -> (mode, object id) of every entry of `tree`, recursively (gitlinks included)."""
    listed = await git_list(
        git,
        checkout,
        ["ls-tree", "-r", "-z", "--full-tree", tree],
        what="the snapshot's tree",
        too_many="the tree is too large to prove against",
        limit=TREE_LIMIT,
    )
    found: dict[str, tuple[str, str]] = {}
    for line in listed:
        meta, _, path = line.partition("\t")
        parts = meta.split(" ")
        if len(parts) == 3 and path:
            found[path] = (parts[0], parts[2])
    return found


async def _flagged(git: Git, checkout: Path) -> dict[str, str]:
    """Index entries git's `status` and `add` do not look at: assume-unchanged (a lowercase
    tag) and skip-worktree (`S`)."""
    listed = await git_list(
        git,
        checkout,
        ["ls-files", "-z", "-v"],
        what="the index's flags",
        too_many="the index is too large to prove against",
        limit=TREE_LIMIT,
    )
    found: dict[str, str] = {}
    for line in listed:
        if len(line) > 2 and line[0] == "S":
            found[line[2:]] = SKIP_WORKTREE
        elif len(line) > 2 and line[0].islower():
            found[line[2:]] = ASSUME_UNCHANGED
    return found


async def _conversions(
    git: Git, checkout: Path, entries: dict[str, tuple[str, str]], settings: _Settings
) -> dict[str, str]:
    """Which files of the tree a filter converts, and how (see `_Walk.convert`)."""
    paths = [p for p, (mode, _oid) in entries.items() if mode in ("100644", "100755")]
    if not paths:
        return {}
    stdin = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
    listed = await git_list(
        git,
        checkout,
        ["check-attr", "-z", "--stdin", *_ATTRS],
        stdin,
        what="the files' attributes",
        too_many="the tree is too large to prove against",
        limit=TREE_LIMIT,
    )
    attrs: dict[str, dict[str, str]] = {}
    for i in range(0, len(listed) - 2, 3):
        path, name, value = listed[i], listed[i + 1], listed[i + 2]
        attrs.setdefault(path, {})[name] = value
    found: dict[str, str] = {}
    for path in paths:
        how = _conversion(attrs.get(path, {}), settings)
        if how:
            found[path] = how
    return found


def _conversion(attrs: dict[str, str], settings: _Settings) -> str:
    """ "" (checkout and add both keep the bytes), "hash" or "predict" for one file."""
    if any(attrs.get(a, "unspecified") not in ("unspecified", "unset") for a in _CONVERTING):
        return "predict"
    text = attrs.get("text", "unspecified")
    crlf = attrs.get("crlf", "unspecified")
    eol = attrs.get("eol", "unspecified")
    if text == "unset" or crlf == "unset":
        return ""
    texty = text != "unspecified" or crlf != "unspecified" or eol != "unspecified"
    if not texty and settings.autocrlf not in ("true", "input"):
        return ""
    out = eol if eol in ("lf", "crlf") else ""
    if not out and crlf == "input":
        out = "lf"
    if not out:
        if settings.autocrlf == "true":
            out = "crlf"
        elif settings.autocrlf == "input":
            out = "lf"
        else:
            out = "crlf" if settings.eol == "crlf" else "lf"
    return "predict" if out == "crlf" else "hash"


async def reflag(git: Git, checkout: Path, flags: dict[str, str]) -> None:
    """Set the index flags the archive recorded again on the restored checkout (after the
    cone is re-applied, which resets skip-worktree on what it covers)."""
    for flag, option in (
        (ASSUME_UNCHANGED, "--assume-unchanged"),
        (SKIP_WORKTREE, "--skip-worktree"),
    ):
        paths = [p for p, f in flags.items() if f == flag]
        if paths:
            stdin = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
            done = await git.run(
                checkout, "update-index", option, "-z", "--stdin", stdin=stdin, check=False
            )
            if not done.ok:
                # The bytes are back either way; only git's shortcut is not: said, not fatal.
                log.warning(
                    "proof.reflag_failed", checkout=str(checkout), flag=flag, paths=len(paths)
                )


# -- the walk (a worker thread) -----------------------------------------------------------------


def _walk_checkout(checkout: Path, walk: _Walk) -> None:
    acc = walk.account
    try:
        top_fd = os.open(checkout, _DIR_FLAGS)
    except OSError as exc:
        acc.unproven.append((".", exc.strerror or str(exc)))
        return

    def unread(rel: str, exc: OSError) -> None:
        acc.unproven.append((rel, exc.strerror or str(exc)))

    # d_type answers what each entry is: most files need no more than their listing, read
    # here from each directory's LISTED step. The mount id is read per directory only where the
    # table has a mount below. What git ignores is not the checkout's work: not looked at
    # (`dropped` and `preserve` cover it).
    policy = treewalk.Policy(
        sort=False,
        stat=False,
        files=False,
        listings=True,
        mount_ids=fsdelete.mounts_below(checkout),
        leave_out={".git", *walk.ignored_dirs},
        errors=unread,
    )
    try:
        for step in treewalk.Walk(top_fd, policy):
            if step.kind != treewalk.LISTED:
                continue  # a directory (walked into, counted in its listing), another mount
            rel, fd = step.rel, step.dir_fd
            if rel and _nested(walk, rel, step.entries):
                step.entries.clear()
                continue
            base = f"{rel}/" if rel else ""
            step.dirs = dirs = []  # what the walk goes into: sorted out here, in one pass
            for entry in step.entries:
                child = base + entry.name
                if child == ".git" or child in walk.ignored_files:
                    continue
                acc.walked += 1  # an ignored directory too: looked at, not walked into
                if entry.is_dir(follow_symlinks=False):
                    dirs.append(entry)  # (the walk leaves out the ignored ones)
                    continue
                try:
                    _visit(walk, fd, entry, child)
                except OSError as exc:
                    if exc.errno == errno.ENOENT:
                        continue  # gone since the listing
                    unread(child, exc)
    finally:
        os.close(top_fd)


def _nested(walk: _Walk, rel: str, listing: list[os.DirEntry[str]]) -> bool:
    """Account for the directory `rel` as a whole when it is empty or a repository of its
    own (True: not walked into)."""
    if not listing:
        if not _tracked_below(walk, rel):
            walk.account.raw.append(RawEntry(rel, EMPTY_DIR))
        return True
    dot_git = next((e for e in listing if e.name == ".git"), None)
    if dot_git is None:
        return False
    known = walk.tree.get(rel)
    if dot_git.is_file(follow_symlinks=False) and known is not None and known[0] == "160000":
        # A submodule: its git directory lives in the checkout's own admin directory and goes
        # with it; a restore initialises it again (bigrepo.init_submodules).
        walk.submodules.append((rel, known[1]))
    else:
        walk.account.raw.append(RawEntry(rel, NESTED))
    return True


def _tracked_below(walk: _Walk, rel: str) -> bool:
    """Whether the tree has `rel` as a gitlink (an uninitialised submodule is an empty
    directory that checkout makes again)."""
    found = walk.tree.get(rel)
    return found is not None and found[0] == "160000"


def _visit(walk: _Walk, fd: int, entry: os.DirEntry[str], rel: str) -> None:
    """Account for one entry of the open directory `fd` that is not a directory."""
    acc = walk.account
    link = entry.is_symlink()
    if not link and not entry.is_file(follow_symlinks=False):
        return  # a special file: no bytes to keep (reported in `dropped.special`)
    known = walk.tree.get(rel)
    if known is None:
        acc.raw.append(RawEntry(rel, UNSEEN))
        return
    mode, oid = known
    if link != (mode == "120000") or mode in ("160000", "040000"):
        acc.raw.append(RawEntry(rel, MODE))
        return
    how = walk.convert.get(rel, "")
    flagged = rel in walk.flagged
    if flagged:
        acc.flags[rel] = walk.flagged[rel]
    if link:
        if walk.settings.symlinks and not flagged:
            return
        target = os.readlink(entry.name, dir_fd=fd)
        if _object_id(walk.settings, os.fsencode(target)) != oid:
            acc.raw.append(RawEntry(rel, FLAGGED if flagged else MODE))
        return
    if not (flagged or how or not walk.settings.filemode):
        return None  # git's add -A read it (see the module's docstring)
    st = entry.stat(follow_symlinks=False)
    if bool(st.st_mode & stat.S_IXUSR) != (mode == "100755"):
        acc.raw.append(RawEntry(rel, FLAGGED if flagged else MODE))
        return
    if how == "predict":
        walk.predict.append((rel, FLAGGED if flagged else FILTERED))
        return
    if (flagged or how) and _file_id(walk.settings, fd, entry.name) != oid:
        acc.raw.append(RawEntry(rel, FLAGGED if flagged else FILTERED))


def _hasher(settings: _Settings) -> hashlib._Hash:
    return hashlib.sha256() if settings.object_format == "sha256" else hashlib.sha1()


def _object_id(settings: _Settings, data: bytes) -> str:
    h = _hasher(settings)
    h.update(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


def _file_id(settings: _Settings, dir_fd: int, name: str) -> str:
    """The blob id of the file's bytes as they are (no filter)."""
    fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file any more")
        h = _hasher(settings)
        h.update(b"blob %d\0" % st.st_size)
        left = st.st_size
        while left > 0:
            chunk = os.read(fd, min(_CHUNK, left))
            if not chunk:
                raise OSError(errno.EIO, "changed while it was read")
            h.update(chunk)
            left -= len(chunk)
        return h.hexdigest()
    finally:
        os.close(fd)


async def _compare_predicted(
    git: Git, checkout: Path, scratch_dir: Path, tree: str, walk: _Walk
) -> None:
    """The converted files, compared with what checkout writes for them: `checkout-index` of
    the tree into a scratch directory, through a temporary index (the user's is never read
    for writing), with the attributes and filters of this checkout."""
    scratch_dir.mkdir(parents=True, exist_ok=True)
    scratch = scratch_dir / f"proof-{secrets.token_hex(6)}"
    index = scratch_dir / f"proof-index-{secrets.token_hex(6)}"
    env = {"GIT_INDEX_FILE": str(index)}
    try:
        await git.run(checkout, "read-tree", tree, env=env, what="git read-tree (the proof)")
        stdin = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p, _ in walk.predict)
        await git.run(
            checkout,
            "checkout-index",
            "-f",
            "-z",
            "--stdin",
            f"--prefix={scratch}/",
            env=env,
            stdin=stdin,
            what="git checkout-index (the proof)",
        )
        differ = await anyio.to_thread.run_sync(_differing, checkout, scratch, walk.predict)
        walk.account.raw.extend(differ)
    finally:
        index.unlink(missing_ok=True)
        await anyio.to_thread.run_sync(lambda: fsdelete.remove_tree(scratch, ignore_errors=True))


async def _submodule_unheld(git: Git, path: Path, commit: str, main_copy: Path | None) -> str:
    """Why a restore would not give the submodule at `path` back ("" when it would): it is
    clean (nothing staged, changed or untracked), at the commit the tree records, and that
    commit is in the main checkout's copy a restore clones it from."""
    status = await git.run(
        path,
        "status",
        "--porcelain=v1",
        "-z",
        "--untracked-files=all",
        "--ignore-submodules=none",
        check=False,
    )
    if not status.ok:
        return "a submodule git cannot read"
    if status.output.text():
        return "a submodule with uncommitted work; commit it in the submodule first"
    head = await git.run(path, "rev-parse", "--verify", "--quiet", "HEAD^{commit}", check=False)
    if not head.ok or head.output.text().strip() != commit:
        return "a submodule away from the commit the checkout records"
    if main_copy is not None:
        held = await git.run(main_copy, "cat-file", "-e", f"{commit}^{{commit}}", check=False)
        if not held.ok:
            return (
                "a submodule at a commit only it holds; push it, or fetch it into the main "
                "checkout's copy of the submodule"
            )
    return ""


def _differing(checkout: Path, scratch: Path, paths: list[tuple[str, str]]) -> list[RawEntry]:
    found: list[RawEntry] = []
    for rel, why in paths:
        if not rawcopy.same(scratch, checkout, rel):
            found.append(RawEntry(rel, why))
    return found
