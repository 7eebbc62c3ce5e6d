"""The git runner: argv only (never a shell), `--` before paths, a deadline on every call, bounded
output that keeps the diagnostic tail, and admin operations serialised per repository (parallel
`git worktree add` in one repository fails at random inside git)."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
from xum_protocol.errors import ErrorKind

from xumd.base.errors import XumError
from xumd.system import childproc, diskfull, gitlocks
from xumd.system.containment import Containment
from xumd.system.procutil import CommandNotFound, CommandResult, run_command

# Git must never prompt (no TTY behind a daemon) nor read the user's pager/editor settings.
_BASE_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "GIT_EDITOR": "true",
    "GIT_OPTIONAL_LOCKS": "0",
    "LC_ALL": "C",
}


class GitError(XumError):
    def __init__(
        self,
        result: CommandResult,
        what: str,
        wrote_to: Sequence[Path | str] = (),
        limit: tuple[str, float] | None = None,
    ) -> None:
        tail = result.output.tail_text(1500).strip()
        message = f"{what}: {result.describe()}" + (f": {tail}" if tail else "")
        kind = ErrorKind.TIMEOUT if result.timed_out else ErrorKind.OPERATION_FAILED
        extra: dict[str, object] = {}
        if result.timed_out:
            # Say what was waited for and which setting bounds it: the operator raises that
            # one (git_timeout_s for git's local work; a fetch has its own, fetch_timeout_s).
            extra["waited_for"] = what
            if limit is not None:
                name, seconds = limit
                message += f" (the limit: {name} = {seconds:g})"
                extra.update(limit=name, limit_s=seconds)
        if not result.timed_out and wrote_to and diskfull.git_says_no_space(tail):
            # git's "unable to write file X" does not say why; name the full filesystem.
            full = diskfull.disk_full(
                wrote_to[0], f"what {what} writes", f"git: {tail}", others=tuple(wrote_to[1:])
            )
            kind, message, extra = full.kind, full.message, full.data
        super().__init__(
            kind,
            message,
            argv=result.argv,
            returncode=result.returncode,
            output_tail=tail,
            **extra,
        )
        self.result = result


_OBJECT_LINE = re.compile(r"[0-9a-f]{40,64} [a-z]+")
_LOCK_EXISTS = re.compile(r"Unable to create '([^']+\.lock)': File exists")
LOCK_POLL_S = 0.05


def _lock_in_the_way(result: CommandResult) -> Path | None:
    """The lock file a failed git command could not create (someone else holds it)."""
    if result.ok or result.timed_out:
        return None
    found = _LOCK_EXISTS.search(result.output.text())
    return Path(found.group(1)) if found else None


class GitLockBusy(GitError):
    """A git lock file held by someone else (after a bounded wait): `busy`, naming the lock and
    the process holding it, so the caller knows whom to wait for."""

    def __init__(self, result: CommandResult, what: str, lock: Path) -> None:
        super().__init__(result, what)
        common = gitlocks.common_dir_above(lock)
        holder = gitlocks.lock_holder(lock, common) if common is not None else {"lock": str(lock)}
        who = f"pid {holder['pid']} ({holder.get('name')})" if "pid" in holder else "unknown"
        self.kind = ErrorKind.BUSY
        self.message = (
            f"{what}: git lock {lock} is held by {who}; the daemon does not remove a lock whose "
            "owner may still run: retry when it finishes"
        )
        self.data = {**self.data, "lock": str(lock), "holders": [holder]}


@dataclass
class Git:
    timeout_s: float = 120.0
    binary: str = "git"
    containment: Containment | None = None
    """The daemon's (handed in by the composition root): a hook's double-forked leftovers are
    stopped too. A Git outside the daemon (tests, benchmarks) runs without one."""
    lock_wait_s: float = 2.0
    limit_name: str = "git_timeout_s"
    """The setting `timeout_s` comes from, named in a timeout's error."""

    def __post_init__(self) -> None:
        self._repo_locks: dict[str, anyio.Lock] = {}

    @asynccontextmanager
    async def admin_lock(self, repo: Path, *, wait_s: float = 60.0) -> AsyncIterator[None]:
        """Serialise admin operations (worktree add/move/remove/prune, ref updates) per repo."""
        key = os.path.realpath(repo)
        lock = self._repo_locks.setdefault(key, anyio.Lock())
        with anyio.move_on_after(wait_s) as scope:
            await lock.acquire()
        if scope.cancelled_caught:
            raise XumError(
                ErrorKind.TIMEOUT,
                f"timed out after {wait_s}s waiting for git operations on {repo} to finish",
                waited_for=f"git admin lock of {repo}",
            )
        try:
            yield
        finally:
            lock.release()

    async def run(
        self,
        repo: Path,
        *args: str,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        check: bool = True,
        what: str | None = None,
    ) -> CommandResult:
        argv = [self.binary, "-C", str(repo), *args]
        full_env = {**os.environ, **_BASE_ENV, **(env or {})}
        result = await self._run_once(argv, full_env, stdin, timeout_s)
        lock = _lock_in_the_way(result)
        if lock is not None:
            # A lock file someone else keeps (the user's own git, or one it left): wait for it
            # boundedly, then run once more. Git takes a lock before the change it guards, and
            # a multi-step command (worktree add) cleans up its own partial work on failure.
            if await self._lock_released(lock):
                result = await self._run_once(argv, full_env, stdin, timeout_s)
                lock = _lock_in_the_way(result)
            if lock is not None and check:
                raise GitLockBusy(result, what or f"git {args[0] if args else ''}", lock)
        if check and not result.ok:
            raise GitError(
                result,
                what or f"git {args[0] if args else ''}",
                _written(repo, args, env),
                # A caller's own deadline is its own to name (the base fetch: fetch_timeout_s).
                (self.limit_name, self.timeout_s) if timeout_s is None else None,
            )
        return result

    async def _run_once(
        self,
        argv: list[str],
        env: dict[str, str],
        stdin: bytes | None,
        timeout_s: float | None,
    ) -> CommandResult:
        try:
            return await run_command(
                argv,
                env=env,
                timeout_s=timeout_s or self.timeout_s,
                stdin=stdin,
                # SIGTERM lets git remove its own lock files; SIGKILL only after a grace.
                grace_s=5.0,
                containment=self.containment,
                # A process group of its own suffices (and skips a new session's cost) unless
                # the daemon has a terminal a hook could read from: xumd.system.childproc.
                own_session=childproc.has_controlling_tty(),
            )
        except CommandNotFound as exc:
            raise XumError(
                ErrorKind.OPERATION_FAILED, f"git is not installed or not on PATH ({exc})"
            ) from None

    async def _lock_released(self, lock: Path) -> bool:
        deadline = anyio.current_time() + self.lock_wait_s
        while os.path.lexists(lock):
            if anyio.current_time() >= deadline:
                return False
            await anyio.sleep(LOCK_POLL_S)
        return True

    async def resolve(self, repo: Path, *names: str) -> list[str | None]:
        """What `git rev-parse --verify --quiet <name>` gives for each name (its object id, or
        None when it names no object, or an ambiguous one), in one git process: `cat-file
        --batch-check` reads the names from stdin (so a name like `-h` is never an option),
        one per line (the caller refuses control characters in names)."""
        if any("\n" in name or "\r" in name for name in names):
            raise ValueError("a name to resolve holds a line break")
        result = await self.run(
            repo,
            # Ambiguity warnings would otherwise interleave with the answers (stderr is merged).
            "-c",
            "core.warnAmbiguousRefs=false",
            "cat-file",
            "--batch-check=%(objectname) %(objecttype)",
            stdin="".join(f"{name}\n" for name in names).encode(),
            what="git cat-file --batch-check",
        )
        found: list[str | None] = []
        pending = list(names)
        for line in result.output.text().splitlines():
            if not pending:
                break
            name = pending[0]
            if line in (f"{name} missing", f"{name} ambiguous"):
                found.append(None)
            elif _OBJECT_LINE.fullmatch(line):
                found.append(line.split(" ", 1)[0])
            else:
                continue  # an error or warning line of git's, not an answer
            pending.pop(0)
        if pending:
            raise GitError(result, "git cat-file --batch-check (answers missing)")
        return found

    async def out(self, repo: Path, *args: str, **kwargs: object) -> str:
        """Run and return stdout+stderr as text, stripped."""
        result = await self.run(repo, *args, **kwargs)  # type: ignore[arg-type]
        return result.output.text().strip()


def _written(repo: Path, args: Sequence[str], env: Mapping[str, str] | None) -> list[Path | str]:
    """Where a git command may have written: the repository, absolute path arguments (the
    checkout of `worktree add`), and an index or object directory given by environment."""
    found: list[Path | str] = [repo]
    found += [arg for arg in args if os.path.isabs(arg)]
    for key in ("GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_DIR"):
        value = (env or {}).get(key)
        if value and os.path.isabs(value):
            found.append(value)
    return found
