"""workspace.create {carry}: the main checkout's uncommitted work, taken into the new checkout.

The order keeps the work in at least one place at every step (docs/RELIABILITY.md, "Carrying
work into a new workspace"):

1. `prepare`, before the intent row: refusals (runtime, in-progress git operations, unmerged
   paths, work git does not see: lifecycle/onbytes.py) and the capture, written as objects
   through a temporary index (lifecycle/snapshot.py): the main checkout's index and files are
   only read.
2. `record`, after the intent row: the capture as a stash-shaped commit (work tree W, parents
   HEAD and the index I) under `refs/xum/carry/<ws-id>`, so a crash from here on leaves it
   there as well as in the main checkout (`git stash apply --index <ref>` gives it back).
3. `restore`, once the checkout exists at the main checkout's HEAD: exactly the carried paths
   written from W, the index entries of the staged ones set from I, then verified: git's view
   of the new checkout is the captured W and I, and each carried path is the main checkout's
   byte for byte (kind, bytes, executable bit). A failure undoes the create (create.py's undo,
   which also drops the ref); the main checkout was never written.
4. `move` (only with `carry: move`), after the workspace is `active`: each carried path of the
   main checkout that still is what was carried (on disk and in the index) is restored to HEAD
   (`git restore --staged --worktree`), an untracked one deleted; a path changed meanwhile is
   left as it is and reported. The ref goes when the carry is done.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.workspace import CarryInfo, CarryLeft, WorkspaceCreateParams

from xumd.base import faults, logs
from xumd.base.errors import XumError
from xumd.lifecycle import onbytes
from xumd.lifecycle.context import Context, some
from xumd.lifecycle.seed import git_list
from xumd.lifecycle.snapshot import IN_PROGRESS, WorkState
from xumd.system import rawcopy
from xumd.system.git import Git

log = logs.get("xumd.lifecycle.carry")

CARRY_NS = "refs/xum/carry"
CARRY_AFTER_CAPTURE = faults.declare(
    "workspace.create.carry.after_capture",
    "the main checkout's work is committed under refs/xum/carry/<ws-id>; no checkout yet",
)
CARRY_AFTER_RESTORE = faults.declare(
    "workspace.create.carry.after_restore",
    "the carried work is restored in the new checkout and verified; the main checkout is "
    "untouched and the row is `creating`",
)
CARRY_MID_MOVE = faults.declare(
    "workspace.create.carry.mid_move",
    "`move`: the carried tracked paths of the main checkout are restored to HEAD, its carried "
    "untracked files are not deleted yet; the workspace is `active` with the work",
)
HOLD_BEFORE_MOVE = faults.declare(
    "workspace.create.carry.hold_before_move",
    "simulate: hold a `move` after the workspace is active, before the main checkout is "
    "compared with what was carried, until the test releases it (faults.FaultPoint.hold)",
    simulate=True,
)

_LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}
_NOT_CARRIED = {
    onbytes.NESTED: "a repository of its own inside the checkout",
    onbytes.FLAGGED: "an index flag (assume-unchanged or skip-worktree) hides its edit",
    onbytes.FILTERED: "a content filter changes its bytes",
    onbytes.UNSEEN: "git does not list it (beyond PATH_MAX)",
    onbytes.MODE: "its mode or kind differs from git's record",
}
"""Entries the proof finds git's view does not hold: a carry would not reproduce them, so it
refuses naming them (an empty directory is made in the new checkout instead)."""


def carry_ref(workspace_id: str) -> str:
    return f"{CARRY_NS}/{workspace_id}"


@dataclass(frozen=True, slots=True)
class Entry:
    """One side of a raw diff: (mode, object id); mode "000000" is no entry."""

    mode: str
    oid: str

    @property
    def absent(self) -> bool:
        return self.mode == "000000"


_UNMERGED = Entry("unmerged", "")


@dataclass(slots=True)
class Capture:
    mode: str
    """"copy" or "move"."""
    state: WorkState
    work: dict[str, tuple[Entry, Entry]] = field(default_factory=dict)
    """path -> (HEAD's entry, W's entry) of every path whose work-tree state differs."""
    index: dict[str, tuple[Entry, Entry]] = field(default_factory=dict)
    """path -> (HEAD's entry, I's entry) of every path whose staged state differs."""
    directories: list[str] = field(default_factory=list)
    commit: str | None = None
    ref: str | None = None

    @property
    def files(self) -> list[str]:
        return sorted(set(self.work) | set(self.index))

    @property
    def untracked(self) -> list[str]:
        return sorted(
            p
            for p, (head, work) in self.work.items()
            if head.absent and not work.absent and p not in self.index
        )

    def on_disk(self, path: str) -> Entry:
        """What the carried path is in W (the files)."""
        if path in self.work:
            return self.work[path][1]
        return self.index[path][0]  # unchanged on disk: HEAD's

    def in_index(self, path: str) -> Entry:
        """What the carried path is in I (the index)."""
        if path in self.index:
            return self.index[path][1]
        return self.work[path][0]  # unchanged in the index: HEAD's

    def in_head(self, path: str) -> bool:
        pair = self.work.get(path) or self.index[path]
        return not pair[0].absent

    def info(self, *, moved: bool = False, left: list[CarryLeft] | None = None) -> CarryInfo:
        return CarryInfo.model_validate(
            {
                "mode": self.mode,
                "files": self.files,
                "staged": sorted(self.index),
                "untracked": self.untracked,
                "directories": self.directories,
                "moved": moved,
                "left": left or [],
            }
        )


# -- 1. before the intent ---------------------------------------------------------------------


async def prepare(ctx: Context, main: Path, params: WorkspaceCreateParams) -> Capture | None:
    """Refuse what cannot be carried, then capture the main checkout's work (objects only)."""
    if params.carry is None:
        return None
    if params.runtime != "worktree":
        raise XumError(
            ErrorKind.INVALID_PARAMS,
            "carry takes a git checkout's changes; runtime 'directory' has none to carry",
        )
    await _refuse_in_progress(ctx.git, main)
    state = await ctx.snapshots.capture(main)  # unmerged paths: not_safe, named
    if not state.dirty:
        return Capture(params.carry, state)
    proof = await ctx.snapshots.prove(main, state.work_tree, main)
    _refuse_unseen(main, proof)
    capture = Capture(
        params.carry,
        state,
        work=await _raw_diff(ctx.git, main, state.head_tree, state.work_tree),
        index=await _raw_diff(ctx.git, main, state.head_tree, state.staged_tree),
        directories=sorted(e.path for e in proof.raw if e.why == onbytes.EMPTY_DIR),
    )
    gitlinks = [p for p in capture.files if "160000" in _modes(capture, p)]
    if gitlinks:
        raise XumError(
            ErrorKind.NOT_SAFE,
            f"cannot carry the work of {main}: submodule changes ({some(gitlinks, 5)}) are "
            "not carried; commit or undo them in the main checkout first",
            files=gitlinks[:100],
            path=str(main),
        )
    return capture


def check_base(capture: Capture | None, base: str | None) -> None:
    """The carried changes are relative to the main checkout's HEAD: the new checkout must
    start there (`base` or an existing branch elsewhere is refused)."""
    if capture is None or base == capture.state.head:
        return
    raise XumError(
        ErrorKind.INVALID_PARAMS,
        f"carry needs the new checkout to start at the main checkout's HEAD "
        f"({capture.state.head[:12]}); the base is {(base or '?')[:12]}: omit base, or pick a "
        "new branch",
        head=capture.state.head,
        base=base,
    )


async def _refuse_in_progress(git: Git, main: Path) -> None:
    git_dir = Path(await git.out(main, "rev-parse", "--absolute-git-dir"))
    doing = [label for entry, label in IN_PROGRESS if os.path.lexists(git_dir / entry)]
    if doing:
        raise XumError(
            ErrorKind.NOT_SAFE,
            f"cannot carry the work of {main}: {doing[0]} is in progress there; finish or "
            "abort it first (its changes are not the checkout's own yet)",
            in_progress=doing,
            path=str(main),
        )


def _refuse_unseen(main: Path, proof: onbytes.Account) -> None:
    held = [(e.path, _NOT_CARRIED[e.why]) for e in proof.raw if e.why in _NOT_CARRIED]
    held += proof.held_back(force=False)
    if held:
        shown = ", ".join(f"{p} ({why})" for p, why in held[:5])
        more = f" and {len(held) - 5} more" if len(held) > 5 else ""
        raise XumError(
            ErrorKind.NOT_SAFE,
            f"cannot carry the work of {main}: git's view would not reproduce {shown}{more}; "
            "commit, move or unflag them first",
            unproven=[{"path": p, "reason": why} for p, why in held[:100]],
            path=str(main),
        )


def _modes(capture: Capture, path: str) -> set[str]:
    pairs = [capture.work.get(path), capture.index.get(path)]
    return {e.mode for pair in pairs if pair for e in pair}


async def _raw_diff(git: Git, repo: Path, a: str, b: str) -> dict[str, tuple[Entry, Entry]]:
    """path -> (entry in a, entry in b) of every path that differs (no rename detection)."""
    listed = await git_list(
        git,
        repo,
        ["diff-tree", "-r", "-z", "--no-renames", a, b],
        what="git diff-tree (the carried changes)",
        too_many="the main checkout's changes are too many to carry",
        limit=onbytes.TREE_LIMIT,
    )
    found: dict[str, tuple[Entry, Entry]] = {}
    for i in range(0, len(listed) - 1, 2):
        meta, path = listed[i], listed[i + 1]
        parts = meta.lstrip(":").split(" ")
        if len(parts) >= 4:
            found[path] = (Entry(parts[0], parts[2]), Entry(parts[1], parts[3]))
    return found


# -- 2. after the intent ----------------------------------------------------------------------


async def record(ctx: Context, main: Path, capture: Capture | None, workspace_id: str) -> None:
    """The capture as a commit under the workspace's carry ref (nothing when clean)."""
    if capture is None or not capture.files:
        return
    commit = await ctx.snapshots.commit_state(
        main,
        capture.state,
        index_message=f"xum index carried into {workspace_id}",
        message=f"xum work carried into {workspace_id}",
    )
    ref = carry_ref(workspace_id)
    await ctx.git.run(main, "update-ref", "-m", "xum carry", ref, commit, what="git update-ref")
    capture.commit, capture.ref = commit, ref
    CARRY_AFTER_CAPTURE()


async def drop_ref(git: Git, main: Path, capture: Capture | None) -> None:
    """Delete the carry ref (only while it still points at this carry's commit)."""
    if capture is None or capture.ref is None or capture.commit is None:
        return
    await git.run(main, "update-ref", "-d", capture.ref, capture.commit, check=False)


# -- 3. into the new checkout ------------------------------------------------------------------


async def restore(ctx: Context, main: Path, checkout: Path, capture: Capture | None) -> None:
    """Write the carried paths into `checkout` (at the same HEAD), set the staged ones' index
    entries, make the empty directories, and verify against the capture and the main checkout.
    Any difference raises (`operation_failed` or `conflict`): the create is undone."""
    if capture is None:
        return
    if capture.files:
        await _write_files(ctx, checkout, capture)
        await _write_index(ctx.git, checkout, capture)
    for rel in capture.directories:
        _inside(checkout, rel).mkdir(parents=True, exist_ok=True)
    await _verify(ctx, main, checkout, capture)
    CARRY_AFTER_RESTORE()


async def _write_files(ctx: Context, checkout: Path, capture: Capture) -> None:
    assert capture.commit is not None
    present = [p for p in capture.files if not capture.on_disk(p).absent]
    gone = [p for p in capture.files if capture.on_disk(p).absent]
    ctx.snapshots.tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp_index = ctx.snapshots.tmp_dir / f"carry-index-{os.urandom(6).hex()}"
    try:
        env = {"GIT_INDEX_FILE": str(tmp_index)}
        await ctx.git.run(checkout, "read-tree", capture.state.work_tree, env=env)
        if present:
            await ctx.git.run(
                checkout,
                "checkout-index",
                "-f",
                "-z",
                "--stdin",
                env=env,
                stdin=_nul(present),
                what="git checkout-index (the carried files)",
            )
    finally:
        tmp_index.unlink(missing_ok=True)
    await anyio.to_thread.run_sync(_remove_all, checkout, gone)


def _remove_all(checkout: Path, paths: list[str]) -> None:
    for rel in paths:
        target = _inside(checkout, rel)
        try:
            if target.is_dir() and not target.is_symlink():
                continue  # a directory where a file was: not this carry's to delete
            target.unlink()
        except FileNotFoundError:
            continue
        _prune_empty(checkout, target.parent)


def _inside(root: Path, rel: str) -> Path:
    """`rel` under `root`, refused when its directory leads out of `root` (a symlink on the
    way)."""
    real = os.path.realpath(root)
    parent = os.path.realpath(os.path.join(real, os.path.dirname(rel)))
    if parent != real and not parent.startswith(real + os.sep):
        raise XumError(
            ErrorKind.OPERATION_FAILED,
            f"{rel!r} leads out of {root} (a symlink on the way); nothing there is written",
            path=rel,
        )
    return Path(parent, os.path.basename(rel))


def _prune_empty(root: Path, directory: Path) -> None:
    """Remove `directory` and its parents while they are empty (never `root`)."""
    real = Path(os.path.realpath(root))
    current = Path(os.path.realpath(directory))
    while current != real and real in current.parents:
        try:
            current.rmdir()
        except OSError:
            return
        current = current.parent


async def _write_index(git: Git, checkout: Path, capture: Capture) -> None:
    """The staged paths' index entries, as I has them (an entry I lacks is removed)."""
    lines = []
    for path, (_head, staged) in sorted(capture.index.items()):
        if staged.absent:
            lines.append(f"0 {'0' * len(staged.oid)}\t{path}")
        else:
            lines.append(f"{staged.mode} {staged.oid}\t{path}")
    if lines:
        await git.run(
            checkout,
            "update-index",
            "-z",
            "--index-info",
            stdin=_nul(lines),
            what="git update-index (the carried index)",
        )
    # Stat data for the entries just set (and those the files changed): no content change.
    await git.run(checkout, "update-index", "-q", "--refresh", check=False)


async def _verify(ctx: Context, main: Path, checkout: Path, capture: Capture) -> None:
    """Git's view of `checkout` is the capture's (W and I), and each carried path and empty
    directory is the main checkout's byte for byte."""
    got = await ctx.snapshots.capture(checkout)
    want = capture.state
    if (got.head, got.staged_tree, got.work_tree) != (want.head, want.staged_tree, want.work_tree):
        raise XumError(
            ErrorKind.OPERATION_FAILED,
            f"the carried work in {checkout} is not what was captured in {main} (git's view "
            "differs); nothing was carried",
            path=str(checkout),
        )
    differ = await anyio.to_thread.run_sync(_differing, main, checkout, capture)
    if differ:
        raise XumError(
            ErrorKind.CONFLICT,
            f"the main checkout {main} changed while its work was carried ({some(differ, 5)}); "
            "nothing was carried: try again",
            files=differ[:100],
            path=str(main),
        )


def _differing(main: Path, checkout: Path, capture: Capture) -> list[str]:
    found = []
    for rel in capture.files:
        if capture.on_disk(rel).absent:
            if os.path.lexists(main / rel) or os.path.lexists(checkout / rel):
                found.append(rel)
        elif not rawcopy.same(main, checkout, rel):
            found.append(rel)
    found += [d for d in capture.directories if not (checkout / d).is_dir()]
    return found


# -- 4. move: out of the main checkout ---------------------------------------------------------


async def move(ctx: Context, main: Path, capture: Capture | None) -> CarryInfo | None:
    """For `move`, restore each carried path of the main checkout that is still what was
    carried to HEAD (an untracked one deleted); the rest is left and reported. Never raises
    but for cancellation: the workspace is active and holds the work either way."""
    if capture is None:
        return None
    if capture.mode != "move" or not capture.files:
        await drop_ref(ctx.git, main, capture)
        return capture.info(moved=capture.mode == "move")
    await HOLD_BEFORE_MOVE.hold()
    left: list[CarryLeft] = []
    done: set[str] = set()
    try:
        unchanged, changed = await _still_carried(ctx.git, main, capture)
        left += [CarryLeft(path=p, reason=why) for p, why in changed]
        tracked = [p for p in unchanged if capture.in_head(p) or not capture.in_index(p).absent]
        if tracked:
            await ctx.git.run(
                main,
                "restore",
                "--source=HEAD",
                "--staged",
                "--worktree",
                "--pathspec-from-file=-",
                "--pathspec-file-nul",
                env=_LITERAL,
                stdin=_nul(tracked),
                what="git restore (the moved paths)",
            )
        done.update(tracked)
        CARRY_MID_MOVE()
        untracked = [p for p in unchanged if p not in done]
        kept = await anyio.to_thread.run_sync(_delete_untracked, main, capture, untracked)
        left += kept
        done.update(set(untracked) - {e.path for e in kept})
    except Exception as exc:  # the workspace holds the work: said in `left`, never raised
        log.exception("workspace.carry_move_failed", main=str(main))
        reported = done | {e.path for e in left}
        left += [
            CarryLeft(path=p, reason=f"not restored in the main checkout: {exc}")
            for p in capture.files
            if p not in reported
        ]
    if left:
        log.warning("workspace.carry_left", main=str(main), left=len(left))
    else:
        await drop_ref(ctx.git, main, capture)
    return capture.info(moved=not left, left=left)


async def _still_carried(
    git: Git, main: Path, capture: Capture
) -> tuple[list[str], list[tuple[str, str]]]:
    """The carried paths whose file and index entry in the main checkout are still the
    carried ones, and (path, why) of those that changed."""
    listed = await git_list(
        git,
        main,
        ["ls-files", "-s", "-z"],
        what="the main checkout's index",
        too_many="the index is too large to compare",
        limit=onbytes.TREE_LIMIT,
    )
    index: dict[str, Entry] = {}
    for line in listed:
        meta, _, path = line.partition("\t")
        parts = meta.split(" ")
        if len(parts) == 3 and path:
            # An unmerged path (stages 1-3) is never the carried entry.
            index[path] = Entry(parts[0], parts[1]) if parts[2] == "0" else _UNMERGED
    sha256 = len(capture.state.head) == 64

    def compare() -> tuple[list[str], list[tuple[str, str]]]:
        same: list[str] = []
        changed: list[tuple[str, str]] = []
        for path in capture.files:
            want, have = capture.in_index(path), index.get(path)
            if (have is not None) if want.absent else (have != want):
                changed.append((path, "its index entry changed after it was carried"))
            elif _disk_entry(main / path, sha256) != capture.on_disk(path):
                changed.append((path, "it changed on disk after it was carried"))
            else:
                same.append(path)
        return same, changed

    return await anyio.to_thread.run_sync(compare)


def _disk_entry(path: Path, sha256: bool) -> Entry:
    """The entry a file on disk would be in git's tree (bytes as they are: the carry refused
    content filters), or an absent one."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return Entry("000000", "0" * (64 if sha256 else 40))
    except NotADirectoryError:
        return Entry("000000", "0" * (64 if sha256 else 40))
    if stat.S_ISLNK(st.st_mode):
        return Entry("120000", _blob_id(os.fsencode(os.readlink(path)), sha256))
    if not stat.S_ISREG(st.st_mode):
        return Entry("040000", "")
    mode = "100755" if st.st_mode & stat.S_IXUSR else "100644"
    return Entry(mode, _file_id(path, sha256))


def _blob_id(data: bytes, sha256: bool) -> str:
    h = hashlib.sha256() if sha256 else hashlib.sha1()
    h.update(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


def _file_id(path: Path, sha256: bool) -> str:
    h = hashlib.sha256() if sha256 else hashlib.sha1()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        size = os.fstat(fd).st_size
        h.update(b"blob %d\0" % size)
        left = size
        while left > 0:
            chunk = os.read(fd, min(1 << 20, left))
            if not chunk:
                raise OSError(errno.EIO, "changed while it was read")
            h.update(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()


def _delete_untracked(main: Path, capture: Capture, paths: list[str]) -> list[CarryLeft]:
    """Delete the carried untracked files still holding the carried bytes (checked again just
    before each deletion); the rest is left."""
    left = []
    sha256 = len(capture.state.head) == 64
    for rel in paths:
        try:
            target = _inside(main, rel)
            if _disk_entry(target, sha256) != capture.on_disk(rel):
                left.append(CarryLeft(path=rel, reason="it changed on disk after it was carried"))
                continue
            target.unlink()
        except (OSError, XumError) as exc:
            left.append(CarryLeft(path=rel, reason=f"not deleted from the main checkout: {exc}"))
            continue
        _prune_empty(main, target.parent)
    return left


def _nul(items: list[str]) -> bytes:
    return b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in items)
