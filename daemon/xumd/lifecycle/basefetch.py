"""A fresh base for `workspace.create {fetch: true}` (or `[create] fetch = true` in the project's
`.xum/config.toml`): fetch the base's remote before the branch is planned, under its own
deadline (`fetch_timeout_s`; git runs like every git: own session, tree-killed on timeout).

Which remote: the one a remote-tracking base names (`origin/main`), else the upstream's remote of
a local branch base (or of HEAD's branch), else `origin`, else the only remote. A local branch (or
HEAD) with an upstream then starts from its fetched upstream: fetching does not move a local
branch, and a fresh base is what the caller asked for. A create that checks out an existing
branch keeps it (the fetch only refreshes the remote-tracking refs).

A fetch that fails or outlives its deadline refuses the create (`fetch_failed`, `timeout`)
before anything is made, unless the caller allowed a stale base; then the local base is used and
the result says so (`fetch.stale`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.checkout_extras import FetchInfo
from xum_protocol.models.workspace import WorkspaceCreateParams

from xumd.base import logs
from xumd.base.config import DaemonConfig
from xumd.base.errors import XumError
from xumd.lifecycle import createconfig
from xumd.lifecycle.rows import ProjectRow
from xumd.system.git import Git

log = logs.get("xumd.lifecycle.basefetch")

_FETCH_LOCKS: dict[str, anyio.Lock] = {}
_REF_RACE = "cannot lock ref"
# A `git worktree add` in flight (another create's) writes a placeholder HEAD for the new
# worktree first; a fetch's connectivity check reads every worktree's HEAD and fails on it.
_WORKTREE_ADDING = "bad object worktrees/"


@dataclass(frozen=True, slots=True)
class Target:
    remote: str | None
    base_ref: str | None
    """The base to plan from after the fetch; None: the caller's base, unchanged."""


async def _full_name(git: Git, repo: Path, spec: str) -> str:
    result = await git.run(
        repo,
        "rev-parse",
        "--verify",
        "--quiet",
        "--symbolic-full-name",
        "--end-of-options",
        spec,
        check=False,
    )
    return result.output.text().strip() if result.ok else ""


def _remote_of(full: str, remotes: list[str]) -> str | None:
    """The remote a `refs/remotes/<remote>/<branch>` name belongs to (remote names may hold
    slashes: the longest one that matches)."""
    matches = [r for r in remotes if full.startswith(f"refs/remotes/{r}/")]
    return max(matches, key=len) if matches else None


async def target(git: Git, repo: Path, base: str | None, branch: str) -> Target:
    remotes = (await git.out(repo, "remote")).split()
    default = "origin" if "origin" in remotes else (remotes[0] if len(remotes) == 1 else None)
    exists = await git.run(
        repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False
    )
    full = await _full_name(git, repo, base or "HEAD")
    if full.startswith("refs/remotes/"):
        return Target(_remote_of(full, remotes) or default, None)
    if full.startswith("refs/heads/"):
        short = full[len("refs/heads/") :]
        upstream = await _full_name(git, repo, f"{short}@{{upstream}}")
        remote = _remote_of(upstream, remotes)
        if remote is not None:
            # An existing branch is checked out as it is: only a new branch takes the upstream.
            return Target(remote, None if exists.ok else upstream)
    return Target(default, None)


async def fetch_base(
    git: Git, repo: Path, params: WorkspaceCreateParams, branch: str, timeout_s: float
) -> tuple[WorkspaceCreateParams, FetchInfo]:
    """Fetch; returns the params to plan from (the base replaced by a fetched upstream where
    that applies) and what the fetch did. Raises unless the caller allowed a stale base."""
    where = await target(git, repo, params.base, branch)
    if where.remote is None:
        return params, _failed(
            params,
            "",
            "fetch_failed",
            f"no remote to fetch the base from in {repo} (add one, or create without fetch)",
        )
    # Two fetches of one remote update the same remote-tracking refs, each by compare-and-swap:
    # at once, one fails ("cannot lock ref ... but expected"). The daemon's own creates take
    # turns per repository; a fetch of someone else's (the user's git) that wins the race is
    # answered by one more try.
    lock = _FETCH_LOCKS.setdefault(os.path.realpath(repo), anyio.Lock())
    with anyio.move_on_after(timeout_s) as waited:
        await lock.acquire()
    if waited.cancelled_caught:
        # Bounded like every wait: a queue of creates behind a hung fetch each get the deadline.
        reason = (
            f"waited {timeout_s:g}s for another fetch of {repo} to finish"
            f" (the limit: fetch_timeout_s = {timeout_s:g})"
        )
        return params, _failed(params, where.remote, "timeout", reason)
    try:
        # Its turn come, the fetch has `timeout_s`: a retry gets what the first try left.
        deadline = anyio.current_time() + timeout_s
        for _attempt in range(2):
            result = await git.run(
                repo,
                "fetch",
                "--quiet",
                "--no-write-fetch-head",
                "--end-of-options",
                where.remote,
                timeout_s=max(0.1, deadline - anyio.current_time()),
                check=False,
            )
            if result.ok or result.timed_out:
                break
            if _WORKTREE_ADDING in result.output.text():
                # The daemon adds worktrees under the admin lock: once it is free, the add is
                # done and its HEAD real; then once more.
                try:
                    async with git.admin_lock(
                        repo, wait_s=max(0.1, deadline - anyio.current_time())
                    ):
                        pass
                except XumError:
                    break
            elif _REF_RACE not in result.output.text():
                break
    finally:
        lock.release()
    if not result.ok:
        tail = result.output.tail_text(1500).strip()
        reason = f"git fetch {where.remote}: {result.describe()}" + (f": {tail}" if tail else "")
        if result.timed_out:
            reason += f" (the limit: fetch_timeout_s = {timeout_s:g})"
        status = "timeout" if result.timed_out else "fetch_failed"
        return params, _failed(params, where.remote, status, reason)
    log.info("workspace.base_fetched", repo=str(repo), remote=where.remote, base=where.base_ref)
    planned = params
    if where.base_ref is not None:
        planned = params.model_copy(update={"base": where.base_ref})
    return planned, FetchInfo(status="fetched", remote=where.remote, base_ref=planned.base)


def _failed(params: WorkspaceCreateParams, remote: str, status: str, reason: str) -> FetchInfo:
    log.warning("workspace.base_fetch_failed", remote=remote, status=status, error=reason)
    if not params.allow_stale_base:
        if status == "timeout":
            raise XumError(
                ErrorKind.TIMEOUT,
                f"{reason}; nothing was created (allow_stale_base: create from the local base)",
                waited_for=f"git fetch {remote}",
                remote=remote,
                limit="fetch_timeout_s",
            )
        raise XumError(
            ErrorKind.FETCH_FAILED,
            f"{reason}; nothing was created (allow_stale_base: create from the local base)",
            remote=remote,
        )
    return FetchInfo(
        status="timeout" if status == "timeout" else "failed",
        remote=remote,
        stale=True,
        error=reason,
        base_ref=params.base,
    )


async def prepare(
    git: Git,
    config: DaemonConfig,
    project: ProjectRow,
    params: WorkspaceCreateParams,
    wanted: createconfig.CreateSettings,
) -> tuple[WorkspaceCreateParams, FetchInfo | None]:
    """Before the branch is planned: fetch when asked (the call's `fetch`, else the project's
    `[create] fetch`, as createconfig.load read it). Only a git worktree has a base to fetch."""
    if params.runtime != "worktree":
        if params.fetch:
            raise XumError(ErrorKind.INVALID_PARAMS, "runtime 'directory' has no base to fetch")
        return params, None
    fetch = params.fetch if params.fetch is not None else wanted.wants_fetch()
    if not fetch:
        return params, None
    branch = params.branch or f"xum/{params.name}"
    return await fetch_base(git, project.path, params, branch, config.fetch_timeout_s)
