"""Snapshots of a checkout's uncommitted work, without touching the user's index, stash or files.

A snapshot is a commit W under `refs/xum/snapshots/<ws-id>/<incarnation>`, shaped like a stash:
- W's tree is the whole working state (tracked files as on disk plus untracked-not-ignored ones),
  so `git show W:<path>` gives any file as it was;
- W's parents are HEAD and I, where I's tree is the staged state (the index), so a restore can
  tell staged from unstaged, and untracked (in W but in neither I nor HEAD) stays untracked.
Both trees are written through a *temporary* index (GIT_INDEX_FILE, a copy of the real one):
`git write-tree` and `git add -A` would otherwise write the user's index.

Ignored files are not snapshotted; `dropped` reports them (count, bytes, top-level paths), and
`preserve` globs copy matching ones into ROOT/archive/<ws-id>/ for unarchive (the life of that
copy: lifecycle/preserved.py).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import secrets
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from xum_protocol.errors import ErrorKind

from xumd.base.errors import XumError
from xumd.lifecycle import onbytes, preserved
from xumd.lifecycle.seed import git_list
from xumd.system import fscopy, fsdelete, rawcopy, smallfile
from xumd.system.git import Git, GitError

SNAPSHOT_NS = "refs/xum/snapshots"
_IDENT = {
    "GIT_AUTHOR_NAME": "xum",
    "GIT_AUTHOR_EMAIL": "xum@localhost",
    "GIT_COMMITTER_NAME": "xum",
    "GIT_COMMITTER_EMAIL": "xum@localhost",
}
_MAX_TOP_PATHS = 50
_OBJECT_ID = re.compile(r"[0-9a-f]{40,64}")
MAX_SPECIAL = 1000
IN_PROGRESS = (
    ("MERGE_HEAD", "a merge"),
    ("rebase-merge", "a rebase"),
    ("rebase-apply", "a rebase or `git am`"),
    ("CHERRY_PICK_HEAD", "a cherry-pick"),
    ("REVERT_HEAD", "a revert"),
    ("sequencer", "a cherry-pick or revert sequence"),
    ("BISECT_LOG", "a bisect"),
)
"""Files in a checkout's git directory that say git is in the middle of something."""


def snapshot_ref(workspace_id: str, incarnation: str) -> str:
    return f"{SNAPSHOT_NS}/{workspace_id}/{incarnation}"


@dataclass(frozen=True, slots=True)
class WorkState:
    head: str
    head_tree: str
    staged_tree: str
    work_tree: str

    @property
    def dirty(self) -> bool:
        return self.staged_tree != self.head_tree or self.work_tree != self.head_tree


@dataclass(slots=True)
class Snapshot:
    ref: str
    commit: str
    files: list[str]

    def as_dict(self) -> dict[str, object]:
        return {"ref": self.ref, "commit": self.commit, "files": self.files}


@dataclass(slots=True)
class Dropped:
    count: int = 0
    bytes: int = 0
    paths: list[str] = field(default_factory=list)
    preserved: list[str] = field(default_factory=list)
    special: list[dict[str, str]] = field(default_factory=list)
    """Special files (path, type): never opened, so neither snapshotted nor copied."""

    def as_dict(self) -> dict[str, object]:
        return {
            "count": self.count,
            "bytes": self.bytes,
            "paths": self.paths,
            "preserved": self.preserved,
            "special": self.special[:MAX_SPECIAL],
        }


class Snapshotter:
    def __init__(self, git: Git, tmp_dir: Path, archive_dir: Path) -> None:
        self.git = git
        self.tmp_dir = tmp_dir
        self.archive_dir = archive_dir

    # -- capture -------------------------------------------------------------------------------

    async def _rev(self, checkout: Path, spec: str) -> str:
        return await self.git.out(checkout, "rev-parse", "--verify", "--quiet", spec)

    async def capture(self, checkout: Path) -> WorkState:
        """Write the staged and the working trees through a temporary index copy (or, for a
        checkout `git status` shows clean, know them to be HEAD's tree: `_clean`)."""
        git_dir, head, head_tree = await self._head(checkout)
        if await self._clean(checkout, git_dir):
            return WorkState(head, head_tree, head_tree, head_tree)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        # Not mutated: any length of the random name is unique per call.
        tmp_index = self.tmp_dir / f"index-{secrets.token_hex(6)}"  # pragma: no mutate
        try:
            real_index = git_dir / "index"
            if real_index.exists():
                shutil.copyfile(real_index, tmp_index)
            env = {"GIT_INDEX_FILE": str(tmp_index)}
            try:
                staged = await self.git.out(checkout, "write-tree", env=env)
            except GitError as exc:
                raise await self._unmerged(checkout, exc) from None
            # `--sparse`: in a sparse checkout, a file the user wrote outside the cone is work
            # too; without it git refuses the whole add (and the archive with it). Entries
            # outside the cone that are not on disk stay as they are (not deletions).
            await self.git.run(
                checkout, "add", "-A", "--sparse", "--", ".", env=env, what="git add -A"
            )
            work = await self.git.out(checkout, "write-tree", env=env)
        finally:
            tmp_index.unlink(missing_ok=True)
        return WorkState(head, head_tree, staged, work)

    async def head_held(self, checkout: Path, head: str) -> bool:
        """Whether a branch, tag or remote-tracking ref holds HEAD's commit. A HEAD on a branch
        is held by it; a detached one (a rebase stopped half way, a checkout of a commit) may
        hold commits nothing else does, which the checkout's own reflog would take with it."""
        branch = await self.git.run(checkout, "symbolic-ref", "-q", "HEAD", check=False)
        if branch.ok and branch.output.text().strip().startswith("refs/heads/"):
            return True
        found = await self.git.run(
            checkout,
            "for-each-ref",
            "--count=1",
            "--format=%(refname)",
            f"--contains={head}",
            "refs/heads",
            "refs/tags",
            "refs/remotes",
        )
        return found.output.text().strip() != ""

    async def refuse_in_progress(self, checkout: Path, name: str, what: str) -> None:
        """`not_safe` while git is in the middle of something in the checkout (a merge, a
        rebase, a cherry-pick, a revert, a bisect, `git am`): its state lives in the checkout's
        admin directory and would go with it, unsaved."""
        git_dir = Path(await self.git.out(checkout, "rev-parse", "--absolute-git-dir"))
        doing = [label for entry, label in IN_PROGRESS if os.path.lexists(git_dir / entry)]
        if doing:
            raise XumError(
                ErrorKind.NOT_SAFE,
                f"cannot {what} {name!r}: {doing[0]} is in progress in its checkout; finish or "
                "abort it first (its state would go with the checkout)",
                in_progress=doing,
                path=str(checkout),
            )

    async def _unmerged(self, checkout: Path, failed: GitError) -> XumError:
        """The error for a capture that failed: `not_safe` naming unmerged paths (a conflict
        git cannot write as a tree), else the failure as it was."""
        try:
            listed = await self._list(checkout, ["ls-files", "-u", "-z"])
        except XumError:
            return failed
        paths = sorted({e.split("\t", 1)[1] for e in listed if "\t" in e})
        if not paths:
            return failed
        return XumError(
            ErrorKind.NOT_SAFE,
            f"the checkout at {checkout} has unmerged paths ({', '.join(paths[:5])}"
            + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
            + "): resolve them (git add) or abort first; a conflict cannot be snapshotted",
            files=paths[:100],
            path=str(checkout),
        )

    async def _head(self, checkout: Path) -> tuple[Path, str, str]:
        """The git dir, HEAD's commit and HEAD's tree, in one git process (`--`: both are
        revisions, never paths; an unborn HEAD fails as `rev-parse --verify` did)."""
        result = await self.git.run(
            checkout, "rev-parse", "--absolute-git-dir", "HEAD^{commit}", "HEAD^{tree}", "--"
        )
        lines = result.output.text().splitlines()
        if (
            len(lines) < 3
            or not os.path.isabs(lines[0])
            # Not mutated: a shape check of git's own answer: ids or a failure.
            or not all(_OBJECT_ID.fullmatch(line) for line in lines[1:3])  # pragma: no mutate
        ):
            raise GitError(result, "git rev-parse HEAD (unexpected answer)")
        return Path(lines[0]), lines[1], lines[2]

    async def _clean(self, checkout: Path, git_dir: Path) -> bool:
        """True when nothing would be snapshotted: `git status` lists no staged, unstaged or
        untracked-not-ignored path, so the index's tree and `add -A`'s tree are both HEAD's.
        Only for an index of version 2: index entries git status does not look at but `add -A
        --sparse` would update (skip-worktree, which needs version 3 or 4) cannot exist there;
        otherwise, and on any doubt, False (the trees are then written as before).
        Submodules are compared whatever the configuration says (`--ignore-submodules=none`),
        as `add -A` would stage a moved one; untracked files are listed whatever
        `status.showUntrackedFiles` says. GIT_OPTIONAL_LOCKS=0 (the runner's): status never
        writes the user's index."""
        try:
            # Never blocking: a FIFO there would hold the event loop's thread
            # (xumd.system.smallfile).
            header = smallfile.read_head(git_dir / "index", 8)
        except OSError:
            return False
        if header != b"DIRC\x00\x00\x00\x02":
            return False
        status = await self.git.run(
            checkout,
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=all",
            "--ignore-submodules=none",
            "--no-renames",
            # Not mutated: a failing status takes the full path, which fails alike.
            check=False,  # pragma: no mutate
        )
        return status.ok and status.output.text() == ""

    async def changed_paths(self, checkout: Path, a: str, b: str) -> list[str]:
        return await self._list(checkout, ["diff-tree", "-r", "-z", "--name-only", a, b])

    async def _list(self, checkout: Path, args: list[str]) -> list[str]:
        """A git listing, whole (never cut in the middle) and from stdout alone: a warning git
        prints is never read as a path (seed.git_list)."""
        return await git_list(
            self.git,
            checkout,
            args,
            what=f"git {args[0]}",
            too_many="the checkout's changes are too many to list",
            limit=onbytes.TREE_LIMIT,
        )

    async def files_of(self, checkout: Path, state: WorkState) -> list[str]:
        files = set(await self.changed_paths(checkout, state.head_tree, state.work_tree))
        files |= set(await self.changed_paths(checkout, state.head_tree, state.staged_tree))
        return sorted(files)

    async def take(
        self,
        checkout: Path,
        workspace_id: str,
        incarnation: str,
        state: WorkState | None = None,
        *,
        always: bool = False,
    ) -> Snapshot | None:
        """Commit the uncommitted state under the workspace's ref; None when there is none
        (unless `always`: a clean checkout whose HEAD no ref holds is kept by the snapshot's
        parent link). Idempotent: the ref name is per incarnation and is simply overwritten on
        replay."""
        state = state or await self.capture(checkout)
        if not state.dirty and not always:
            return None
        commit = await self.commit_state(
            checkout,
            state,
            index_message=f"xum index of {workspace_id} ({incarnation})",
            message=f"xum snapshot of {workspace_id} ({incarnation})",
        )
        ref = snapshot_ref(workspace_id, incarnation)
        await self.git.run(
            checkout, "update-ref", "-m", "xum snapshot", ref, commit, what="git update-ref"
        )
        return Snapshot(ref=ref, commit=commit, files=await self.files_of(checkout, state))

    async def commit_state(
        self, checkout: Path, state: WorkState, *, index_message: str, message: str
    ) -> str:
        """The captured state as a commit in stash shape: its tree the work tree, its parents
        HEAD and a commit of the staged tree (so a restore keeps staged and unstaged apart).
        Returns the commit; no ref is written."""
        index_commit = await self.git.out(
            checkout,
            "commit-tree",
            state.staged_tree,
            "-p",
            state.head,
            "-m",
            index_message,
            env=_IDENT,
        )
        return await self.git.out(
            checkout,
            "commit-tree",
            state.work_tree,
            "-p",
            state.head,
            "-p",
            index_commit,
            "-m",
            message,
            env=_IDENT,
        )

    async def holds(self, checkout: Path, state: WorkState, snapshot_commit: str | None) -> bool:
        """True when `snapshot_commit` holds exactly this uncommitted state."""
        if not snapshot_commit:
            return False
        # (`rev-parse --verify` takes one name only.)
        result = await self.git.run(
            checkout,
            "rev-parse",
            "--quiet",
            f"{snapshot_commit}^{{tree}}",
            f"{snapshot_commit}^2^{{tree}}",
            # Not mutated: a failing status takes the full path, which fails alike.
            check=False,  # pragma: no mutate
        )
        if not result.ok:
            return False
        trees = result.output.text().split()
        return trees == [state.work_tree, state.staged_tree]

    async def unsaved_files(
        self, checkout: Path, state: WorkState, snapshot_commit: str | None
    ) -> list[str]:
        """Paths whose uncommitted state `snapshot_commit` does not hold (all dirty paths when
        there is no snapshot); empty when nothing would be lost."""
        if not state.dirty:
            return []
        if not snapshot_commit:
            return await self.files_of(checkout, state)
        files = set(await self.changed_paths(checkout, snapshot_commit, state.work_tree))
        files |= set(await self.changed_paths(checkout, f"{snapshot_commit}^2", state.staged_tree))
        return sorted(files)

    # -- restore -------------------------------------------------------------------------------

    async def restore(self, checkout: Path, commit: str) -> list[str]:
        """Make the checkout's files W's tree and its index I's tree (staged stays staged,
        untracked stays untracked). Returns the paths that differ from HEAD."""
        index_commit = await self._rev(checkout, f"{commit}^2")
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        # Not mutated: any length of the random name is unique per call.
        tmp_index = self.tmp_dir / f"index-{secrets.token_hex(6)}"  # pragma: no mutate
        try:
            env = {"GIT_INDEX_FILE": str(tmp_index)}
            await self.git.run(checkout, "read-tree", commit, env=env)
            await self.git.run(checkout, "checkout-index", "-a", "-f", env=env)
        finally:
            tmp_index.unlink(missing_ok=True)
        deleted = await self._list(
            checkout, ["diff-tree", "-r", "-z", "--name-only", "--diff-filter=D", "HEAD", commit]
        )
        root = os.path.realpath(checkout)
        for rel in deleted:
            target = os.path.realpath(os.path.join(root, os.path.dirname(rel)))
            if target == root or target.startswith(root + os.sep):
                Path(target, os.path.basename(rel)).unlink(missing_ok=True)
        await self.git.run(checkout, "read-tree", index_commit)
        await self.git.run(checkout, "update-index", "-q", "--refresh", check=False)
        head_tree = await self._rev(checkout, "HEAD^{tree}")
        files = set(await self.changed_paths(checkout, head_tree, commit))
        files |= set(await self.changed_paths(checkout, head_tree, index_commit))
        return sorted(files)

    # -- dirty files (for not_safe) ------------------------------------------------------------

    async def dirty_files(self, checkout: Path) -> list[str]:
        entries = await self._list(
            checkout, ["status", "--porcelain=v1", "-z", "--untracked-files=all"]
        )
        files: list[str] = []
        skip = False
        for entry in entries:
            if skip:
                skip = False
                continue
            if len(entry) < 4:
                continue  # pragma: no mutate (the only short entry is the empty last one)
            if entry[0] in "RC":
                skip = True  # the next entry is the rename's source
            files.append(entry[3:])
        return files

    # -- ignored files: report and preserve ----------------------------------------------------

    async def ignored(self, checkout: Path) -> list[str]:
        # Every entry or an error (never a listing cut in the middle: an ignored file that
        # `preserve` asks to keep, listed there, would go with the checkout unsaved).
        return await git_list(
            self.git,
            checkout,
            ["ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory"],
            what="the checkout's ignored files",
            too_many="nothing was changed",
        )

    async def preserved_in(
        self, checkout: Path, globs: list[str], ignored: list[str] | None = None
    ) -> list[str]:
        """The checkout's ignored files that `preserve` globs ask to keep (relative paths);
        `ignored`: git's ignored listing when the caller has it already (a proof's)."""
        if not globs:
            return []
        entries = ignored if ignored is not None else await self.ignored(checkout)
        return await anyio.to_thread.run_sync(self.preserved_files, checkout, entries, globs)

    async def prove(self, checkout: Path, tree: str, main: Path | None) -> onbytes.Account:
        """The account of every entry of the checkout that is not ignored against `tree`
        (lifecycle/onbytes.py): what a restore of `tree` gives back, and what it does not.
        `main`: the project's main checkout (submodules are initialised from its copies)."""
        ignored = await self.ignored(checkout)
        proof = await onbytes.account(self.git, checkout, tree, ignored, main, scratch=self.tmp_dir)
        proof.ignored = ignored
        return proof

    async def report_and_preserve(
        self,
        checkout: Path,
        workspace_id: str,
        incarnation: str,
        globs: list[str],
        proof: onbytes.Account | None = None,
    ) -> Dropped:
        """Report the ignored files, and save the preserved ones, the `raw` entries (what the
        snapshot cannot give back) and the index flags in the archive store, in one copy
        written whole. With a proof, its ignored listing is reused: the report then speaks of
        the same listing the proof was made against."""
        entries = proof.ignored if proof is not None and proof.ignored is not None else None
        entries = entries if entries is not None else await self.ignored(checkout)
        return await anyio.to_thread.run_sync(
            lambda: self._report_and_preserve(
                checkout, workspace_id, incarnation, entries, globs, proof=proof
            )
        )

    def _report_and_preserve(
        self,
        checkout: Path,
        workspace_id: str,
        incarnation: str,
        entries: list[str],
        globs: list[str],
        *,
        proof: onbytes.Account | None = None,
    ) -> Dropped:
        dropped = Dropped()
        raw = proof.raw if proof is not None else []
        flags = proof.flags if proof is not None else {}
        top: list[str] = []
        files_under: dict[str, list[str]] = {}
        matched: list[str] = []
        seen: set[str] = set()
        for entry in entries:
            first = entry.rstrip("/").split("/")[0] + (
                "/" if "/" in entry.rstrip("/") or entry.endswith("/") else ""
            )
            if first not in top:
                top.append(first)
            under = files_under.setdefault(first, [])
            full = checkout / entry
            for rel, size in _walk_files(checkout, full):
                # git lists a directory holding only ignored files *and* those files
                # (`sub/` and `sub/.env`): each file counts, and is copied, once.
                if rel in seen:
                    continue
                seen.add(rel)
                under.append(rel)
                dropped.count += 1
                dropped.bytes += size
                if globs and _matches(rel, globs):
                    matched.append(rel)
        kept = set(matched)
        # A top-level path is named as dropped only when something under it is: one whose
        # every file is preserved (`.env`) is not lost (an empty directory still is).
        top = [t for t in top if not files_under[t] or any(r not in kept for r in files_under[t])]
        dropped.paths = top[:_MAX_TOP_PATHS]
        # git never lists special files (FIFOs, sockets, devices): without this walk they
        # would go with the checkout without a mention.
        # (Never among `matched`: `_walk_files` lists no special file.)
        dropped.special = [s.as_dict() for s in fscopy.special_files(checkout, _skip_git)]
        store = self.archive_dir / workspace_id
        # Not mutated: any length of the random suffix keeps it apart.
        tmp = self.archive_dir / f".{workspace_id}.{secrets.token_hex(4)}"  # pragma: no mutate
        # A copy of another incarnation is the user's until an unarchive settled it: kept.
        preserved.set_aside_other(store, incarnation)
        if matched or raw or flags:
            self.archive_dir.mkdir(parents=True, exist_ok=True)
            needed = sum((checkout / rel).lstat().st_blocks * 512 for rel in matched)
            fscopy.check_space(self.archive_dir, needed, len(matched), "the preserved files")
            try:
                tmp.mkdir(mode=0o700)
                for rel in matched:
                    dest = tmp / "files" / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    fscopy.copy_file(checkout / rel, dest)
                if raw:
                    rawcopy.save(checkout, [e.path for e in raw], tmp / preserved.RAW_DIR)
                manifest: dict[str, object] = {
                    "workspace_id": workspace_id,
                    "incarnation": incarnation,
                    "files": matched,
                }
                if raw:
                    manifest["raw"] = [e.as_dict() for e in raw]
                if flags:
                    manifest["flags"] = flags
                (tmp / "manifest.json").write_text(json.dumps(manifest))
            except BaseException:
                # (A full disk): the archive fails and rolls back; no half copy stays behind.
                fsdelete.remove_tree(tmp, ignore_errors=True)
                raise
            if store.exists():
                fsdelete.remove_tree(store)
            os.replace(tmp, store)
            dropped.preserved = matched
            dropped.count -= len(matched)
            dropped.bytes -= sum((store / "files" / r).lstat().st_size for r in matched)
        return dropped

    def restore_raw(self, workspace_id: str, checkout: Path) -> rawcopy.Placed:
        """Write the saved raw entries back over the restored checkout."""
        copy = preserved.load(self.archive_dir / workspace_id)
        if copy is None or not copy.raw:
            return rawcopy.Placed()
        return rawcopy.place(copy.raw_root, checkout, copy.raw)

    def restore_preserved(self, workspace_id: str, checkout: Path) -> list[str]:
        store = self.archive_dir / workspace_id
        try:
            manifest = json.loads((store / "manifest.json").read_text())
        except (OSError, ValueError):
            return []
        restored: list[str] = []
        for rel in manifest.get("files", []):
            src = store / "files" / rel
            target = preserved.target_in(checkout, rel)
            if target is None:
                continue  # a symlinked directory leads out of the checkout: never written
            dest = target
            if not src.exists() and not src.is_symlink():
                continue
            if dest.exists() or dest.is_symlink():
                continue  # never overwrite what the new checkout already has
            dest.parent.mkdir(parents=True, exist_ok=True)
            fscopy.copy_file(src, dest)  # holes kept, space checked, a partial copy removed
            restored.append(rel)
        return restored

    def preserved_files(self, checkout: Path, entries: list[str], globs: list[str]) -> list[str]:
        """The ignored files (of `ignored()`'s `entries`) that `globs` ask to keep."""
        if not globs:
            return []
        found = {
            rel
            for entry in entries
            for rel, _size in _walk_files(checkout, checkout / entry)
            if _matches(rel, globs)
        }
        return sorted(found)  # (git may list a file and its directory: once each)


def _skip_git(rel: str) -> bool:
    return rel == ".git"


def _walk_files(checkout: Path, full: Path) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    try:
        st = full.lstat()
    except OSError:
        return found
    if not stat.S_ISDIR(st.st_mode):
        if _countable(st.st_mode):
            found.append((str(full.relative_to(checkout)), st.st_size))
        return found
    under = full.relative_to(checkout)
    return [(f"{under}/{rel}", size) for rel, size in fscopy.files_within(full)]


def _countable(mode: int) -> bool:
    """Regular files and symlinks are ignored files; a FIFO, socket or device is a special
    file (`Dropped.special`), reported there once and never counted or copied as a file."""
    return stat.S_ISREG(mode) or stat.S_ISLNK(mode)


def _matches(rel: str, globs: list[str]) -> bool:
    base = rel.rsplit("/", 1)[-1]
    return any(
        fnmatch.fnmatchcase(rel, g) or ("/" not in g and fnmatch.fnmatchcase(base, g))
        for g in globs
    )
