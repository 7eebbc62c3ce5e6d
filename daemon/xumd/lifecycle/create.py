"""workspace.create: the intent row (state `creating`, planned path, branch, fresh incarnation,
delegation binding) is committed before anything exists on disk; then the checkout, setup, and
`active`. A create that fails part-way undoes exactly what it made."""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio
from xum_protocol.errors import ErrorKind
from xum_protocol.models.base import CONTROL_RE
from xum_protocol.models.checkout_extras import SparseInfo, SubmoduleInfo
from xum_protocol.models.workspace import WorkspaceCreateParams, WorkspaceCreateResult
from xum_protocol.models.wsenv import CopyReport, env_problem

from xumd.base import faults, logs, requestkey
from xumd.base.errors import XumError
from xumd.lifecycle import (
    basefetch,
    bigrepo,
    capacity,
    carry,
    casealias,
    createconfig,
    ids,
    materialise,
    owned,
    ports,
    rows,
    seed,
    setup,
    wsenv,
)
from xumd.lifecycle.context import UNDO_DEADLINE_S, Context
from xumd.lifecycle.pool import records as pool_records
from xumd.lifecycle.pool import service as pool
from xumd.lifecycle.rows import ProjectRow, WorkspaceRow

log = logs.get("xumd.lifecycle.create")

CREATE_AFTER_INTENT = faults.declare("workspace.create.after_intent")
CREATE_AFTER_CHECKOUT = faults.declare("workspace.create.after_checkout")
CREATE_AFTER_SETUP = faults.declare("workspace.create.after_setup")
CREATE_AFTER_ACTIVE = faults.declare(
    "workspace.create.after_active",
    "the workspace is active; the answer is not sent (a keyed repeat answers it from the row)",
)
UNDO_AFTER_DISCARD = faults.declare(
    "workspace.create.undo.after_discard",
    "a failed create took its checkout back; the branch it made and the row remain",
)
HOLD = faults.declare(
    "workspace.create.hold",
    "simulate: hold a create after its checks, before its intent row is inserted, until the "
    "test releases it (faults.FaultPoint.hold)",
    simulate=True,
)
UNDO_AFTER_BRANCH = faults.declare(
    "workspace.create.undo.after_branch",
    "a failed create took its checkout and branch back; the `creating` row remains",
)


@dataclass(frozen=True, slots=True)
class IntentBinding:
    """A delegated turn's binding, written by the daemon in the target's intent transaction
    (never from client params): `record(workspace_id)` runs inside that same transaction."""

    handle_id: str
    owner_workspace_id: str
    record: Callable[[str], None]


@dataclass(frozen=True, slots=True)
class BranchPlan:
    branch: str
    base: str
    """The resolved commit the branch starts from (or points at, when it exists)."""
    create: bool
    """True when this create makes the branch (and so its undo deletes it)."""


async def create(
    ctx: Context, params: WorkspaceCreateParams, binding: IntentBinding | None = None
) -> WorkspaceCreateResult:
    project = ctx.project(params.project_id)
    ids.check_name(params.name)
    async with ctx.coord.project_shared(project.id, label=f"create {params.name}"):
        project = ctx.project(params.project_id)
        return await _create(ctx, project, params, binding)


def _check_params(ctx: Context, project: ProjectRow, params: WorkspaceCreateParams) -> None:
    if params.runtime == "worktree" and project.kind != "git":
        raise XumError(
            ErrorKind.INVALID_PARAMS,
            f"project {project.name!r} is not a git repository; use runtime 'directory'",
        )
    if params.runtime == "directory" and (params.branch or params.base):
        raise XumError(ErrorKind.INVALID_PARAMS, "runtime 'directory' takes no branch or base")
    owned.check_workspace_path(
        ctx.path_for(project, params.name), project, ctx.app.paths, rows.list_projects(ctx.store)
    )
    existing = rows.workspace_by_name(ctx.store, project.id, params.name)
    if existing is not None:
        raise XumError(
            ErrorKind.CONFLICT,
            f"project {project.name!r} already has a workspace {params.name!r} ({existing.id})",
            id=existing.id,
        )
    casealias.check_no_case_alias(ctx.store, ctx.path_for(project, params.name))


def _insert_intent(
    ctx: Context,
    project: ProjectRow,
    params: WorkspaceCreateParams,
    plan: BranchPlan | None,
    binding: IntentBinding | None,
    *,
    also: Callable[[str], None] | None = None,
) -> str:
    workspace_id = ids.new_id(ids.WORKSPACE)
    now = time.time()
    try:
        with ctx.store.transaction():
            rows.insert_creating(
                ctx.store,
                workspace_id,
                project_id=project.id,
                name=params.name,
                runtime=params.runtime,
                path=str(ctx.path_for(project, params.name)),
                branch=plan.branch if plan else None,
                base=plan.base if plan else None,
                branch_created=plan.create if plan else False,
                incarnation=ids.new_incarnation(),
                auto_archive=params.auto_archive,
                handle_id=binding.handle_id if binding else None,
                owner_workspace_id=binding.owner_workspace_id if binding else None,
                now=now,
            )
            # Counted with this row, in its transaction: two creates checked at one place
            # below `max_workspaces` cannot both take it.
            capacity.check_count(ctx.store, project.id, ctx.app.config.gc.max_workspaces)
            if binding is not None:
                binding.record(workspace_id)
            if also is not None:
                also(workspace_id)
            # A keyed create's key names this workspace from the moment it may exist.
            requestkey.bind_target(workspace_id, "workspace.create")
    except sqlite3.IntegrityError:
        raise XumError(
            ErrorKind.CONFLICT,
            f"project {project.name!r} already has a workspace {params.name!r}",
        ) from None
    return workspace_id


async def _create(
    ctx: Context,
    project: ProjectRow,
    params: WorkspaceCreateParams,
    binding: IntentBinding | None,
) -> WorkspaceCreateResult:
    _check_params(ctx, project, params)
    wanted = createconfig.load(project.path)  # a broken config refuses before any fetch
    env = _workspace_env(wanted, params)
    params, fetched = await basefetch.prepare(ctx.git, ctx.app.config, project, params, wanted)
    plan = await _plan_branch(ctx, project, params) if params.runtime == "worktree" else None
    sparse = await bigrepo.sparse_patterns(ctx.git, project.path) if plan else None
    carrying = await carry.prepare(ctx, project.path, params)  # refusals: before the intent
    carry.check_base(carrying, plan.base if plan else None)
    room = await _room(ctx, project, params, plan, sparse=sparse, wanted=wanted)  # before intent
    submodules: list[SubmoduleInfo] = []
    claim = pool.Claim(None)
    await HOLD.hold()
    row = ctx.row(
        _insert_intent(ctx, project, params, plan, binding, also=_extras(ctx, wanted, env))
    )
    ctx.publish("workspace.created", row)
    cleared: list[str] = []
    made = False
    try:
        CREATE_AFTER_INTENT()
        await carry.record(ctx, project.path, carrying, row.id)
        async with ctx.coord.directories.directory(row.path, label=f"create {row.id}"):
            # Revalidate after the wait: the row is still ours, and nothing is at the path
            # (a cleanup that held the directory may just have emptied it, or not).
            row = ctx.row(row.id)
            if os.path.lexists(row.path):
                raise XumError(
                    ErrorKind.CONFLICT,
                    f"{row.path} already exists; choose another name",
                    path=str(row.path),
                )
            row.path.parent.mkdir(parents=True, exist_ok=True)
            made = True
            claim = await _claim(ctx, project, row, plan, sparse, wanted=wanted)
            if claim.hit:
                # A submodule's git dir names its checkout by a relative path, so entries are
                # made without them: initialised here, at the workspace's path.
                submodules = await bigrepo.init_submodules(ctx.git, project.path, row.path)
            elif plan is not None:
                new_from = plan.base if plan.create else None
                cleared = await materialise.add_worktree(
                    ctx.git, project.path, row, plan.branch, new_from, no_checkout=bool(sparse)
                )
                if sparse is not None:
                    await bigrepo.apply_sparse(ctx.git, project.path, row.path, sparse)
                submodules = await bigrepo.init_submodules(ctx.git, project.path, row.path)
            else:
                materialise.make_directory(row)
        CREATE_AFTER_CHECKOUT()
        st = row.path.stat()
        with ctx.store.transaction():
            row = ctx.update(row, dev=st.st_dev, ino=st.st_ino)
        await carry.restore(ctx, project.path, row.path, carrying)
        copied = await seed_checkout(ctx, project, row, wanted.copy)
        row, outcome = await setup.run(ctx, row)
        CREATE_AFTER_SETUP()
        row = setup.activate(ctx, row, outcome)
    except BaseException as exc:
        try:
            with anyio.CancelScope(shield=True), anyio.move_on_after(UNDO_DEADLINE_S):
                await _undo(ctx, project, row, made, exc)
                await carry.drop_ref(ctx.git, project.path, carrying)
        finally:
            # An undo that failed or was cut short leaves the row `creating`: flag it, as the
            # startup pass would (create holds no exclusive reservation to do it on the way out).
            ctx.settle_failed(row.id, "create", exc)
        raise
    ctx.publish("workspace.state_changed", row)
    CREATE_AFTER_ACTIVE()
    with anyio.CancelScope(shield=True):
        # Active and holding the work: the move out of the main checkout is not cut half way.
        carried = await carry.move(ctx, project.path, carrying)
    log.info("workspace.created", workspace=row.id, project=project.id, path=str(row.path))
    if ctx.app.config.gc.budgeted():
        ctx.room.created()  # the budget checked in the background, after what this wrote
    return WorkspaceCreateResult(
        workspace=ctx.info(row),
        setup=setup.result(outcome),
        cleared_locks=cleared,
        base_commit=plan.base if plan else None,
        fetch=fetched,
        sparse=sparse,
        submodules=submodules,
        ignored_copy=copied,
        carried=carried,
        pool=claim.outcome,
        materialised="pool" if claim.hit else ("git" if plan else "directory"),
        evicted=room.evicted,
    )


async def _room(
    ctx: Context,
    project: ProjectRow,
    params: WorkspaceCreateParams,
    plan: BranchPlan | None,
    *,
    sparse: SparseInfo | None,
    wanted: createconfig.CreateSettings,
) -> capacity.Made:
    """While a disk budget is set: what the checkout and its `[create] copy` will write (a
    ready warm pool entry at this base is already on disk: nothing for the checkout; a sparse
    or directory workspace: not estimated) and the project's workspace count, made room for
    (gc collects what the policy allows) or refused before anything is made."""
    gc = ctx.app.config.gc
    if not gc.budgeted():
        return capacity.Made()
    need: int | None = None
    if plan is not None and sparse is None and capacity.sizes(gc):
        size = pool.size(wanted, ctx.app.config.create.pool)
        ready = pool_records.take_ready(ctx.store, project.id, plan.base, None)
        hit = size > 0 and ready is not None
        need = 0 if hit else await capacity.tree_bytes(ctx.git, project.path, plan.base)
        if need is not None and project.kind == "git":
            cap = ctx.app.config.create.copy_max_bytes
            need += await capacity.copy_bytes(ctx.git, project.path, wanted.copy, cap)
    what = f"a checkout of {plan.base[:12]}" if plan else f"workspace {params.name!r}"
    where = ctx.path_for(project, params.name).parent
    wants = capacity.Need(where, need, project.id, params.name)
    return await capacity.ensure(wants, gc, what, ctx.room, ctx.store)


async def _claim(
    ctx: Context,
    project: ProjectRow,
    row: WorkspaceRow,
    plan: BranchPlan | None,
    sparse: SparseInfo | None,
    *,
    wanted: createconfig.CreateSettings,
) -> pool.Claim:
    """A warm pool entry taken over as this checkout (lifecycle/pool/), or why not: a miss or
    a stale entry leaves the fresh checkout to the caller; nothing here fails a create."""
    size = pool.size(wanted, ctx.app.config.create.pool)
    if plan is None:
        return pool.Claim(None)
    return await ctx.pool.claim(
        project, row, pool_size=size, base=plan.base, sparse=sparse, new_branch=plan.create
    )


def _workspace_env(
    wanted: createconfig.CreateSettings, params: WorkspaceCreateParams
) -> dict[str, str]:
    """The project's `[env]` with the request's `env` over it. Each was checked alone; what is
    stored and given to every child is the merge, so it is checked too (the limits)."""
    env = {**wanted.env, **params.env}
    problem = env_problem(env, "env (the request's with the project's [env])")
    if problem:
        raise XumError(ErrorKind.INVALID_PARAMS, problem)
    return env


def _extras(
    ctx: Context, wanted: createconfig.CreateSettings, env: dict[str, str]
) -> Callable[[str], None]:
    """What the intent transaction writes beside the row: the ports (allocated now, before
    any checkout exists: a crash leaves both or neither) and the environment."""
    count = wanted.ports if wanted.ports is not None else ctx.app.config.ports.count

    def write(workspace_id: str) -> None:
        ports.allocate(
            ctx.store, workspace_id, count, ctx.app.config.ports, names=wanted.port_names
        )
        wsenv.store_env(ctx.store, workspace_id, env)

    return write


async def seed_checkout(
    ctx: Context, project: ProjectRow, row: WorkspaceRow, patterns: list[str]
) -> CopyReport:
    """Copy the main checkout's matching ignored files into the new checkout (lifecycle/
    seed.py); worktrees of git projects only (the matching is git's; a directory runtime's
    archive restores its whole content, which must not meet a second copy)."""
    if not patterns or project.kind != "git" or row.runtime != "worktree":
        return CopyReport(status="none")
    cfg = ctx.app.config.create
    return await seed.seed(
        ctx.git,
        project.path,
        row.path,
        patterns,
        cap=cfg.copy_max_bytes,
        timeout_s=cfg.copy_timeout_s,
        stopping=lambda: bool(ctx.app.stopping),
    )


async def _plan_branch(
    ctx: Context, project: ProjectRow, params: WorkspaceCreateParams
) -> BranchPlan:
    branch = params.branch or f"xum/{params.name}"
    if CONTROL_RE.search(branch):
        raise XumError(
            ErrorKind.INVALID_NAME,
            f"{branch!r} is not a valid branch name: it contains control characters",
            branch=branch,
        )
    if params.base is not None and CONTROL_RE.search(params.base):
        raise XumError(
            ErrorKind.INVALID_PARAMS,
            f"base {params.base!r} contains control characters; pass a commit, branch or tag",
            base=params.base,
        )
    if not plain_branch_name(branch):
        # Not certainly valid by the conservative rule: git decides (rarely taken).
        check = await ctx.git.run(project.path, "check-ref-format", "--branch", branch, check=False)
        # `--branch` also expands `@{-1}` and the like; only a name that is itself valid is
        # taken.
        if not check.ok or check.output.text().strip() != branch:
            raise XumError(
                ErrorKind.INVALID_NAME, f"{branch!r} is not a valid branch name", branch=branch
            )
    # One git process answers what three `rev-parse --verify` did: does the branch exist,
    # where does it point, and where does the base (or HEAD) point.
    ref = f"refs/heads/{branch}"
    exists, existing, base = await ctx.git.resolve(
        project.path, ref, f"{ref}^{{commit}}", f"{params.base or 'HEAD'}^{{commit}}"
    )
    if exists is not None and params.base:
        raise XumError(
            ErrorKind.CONFLICT,
            f"branch {branch!r} already exists; omit base to check it out, or pick a branch",
            branch=branch,
        )
    spec, resolved = (ref, existing) if exists is not None else (params.base or "HEAD", base)
    if resolved is None:
        raise XumError(
            ErrorKind.NOT_FOUND, f"base {spec!r} is not a commit in {project.path}", base=spec
        )
    return BranchPlan(branch, resolved, create=exists is None)


async def _undo(
    ctx: Context, project: ProjectRow, row: WorkspaceRow, made: bool, cause: BaseException
) -> None:
    """Undo exactly what this create made: the worktree (or directory), the branch if it
    was created here, then the intent row."""
    log.warning("workspace.create_undo", workspace=row.id, cause=repr(cause))
    if made:
        await materialise.discard(ctx.git, project.path, row)
        UNDO_AFTER_DISCARD()
    ours = not isinstance(cause, materialise.BranchTaken)  # else a concurrent create's branch
    if made and ours and row.branch_created and row.branch and row.base:
        async with ctx.git.admin_lock(project.path):
            # Only when it still points where we created it: never drop others' work.
            await ctx.git.run(
                project.path,
                "update-ref",
                "-d",
                f"refs/heads/{row.branch}",
                row.base,
                check=False,
            )
        UNDO_AFTER_BRANCH()
    with ctx.store.transaction():
        rows.delete_created(ctx.store, row.id)
    ctx.app.events.publish("workspace.removed", workspace_id=row.id, reason="create failed")


# A branch name that is certainly valid for git, decided without running git.
#
# `git check-ref-format --branch` costs a process (milliseconds in the daemon) on every create.
# The rule here is deliberately narrower than git's (git-check-ref-format(1)): slash-separated
# components of ASCII letters, digits, `_`, `.` and `-`, none starting with `.` or `-`, none
# ending with `.` or `.lock`, no `..`, and not `HEAD`. Every name it accepts is valid for git
# (each of git's refusals needs a character or a shape this excludes); a name it does not accept
# is not refused here: the caller asks git, which decides as before.
_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def plain_branch_name(name: str) -> bool:
    """True only for a name git certainly accepts as a branch (see the module's rule)."""
    if name == "HEAD" or ".." in name:
        return False
    for part in name.split("/"):
        if not _COMPONENT.fullmatch(part) or part.endswith((".", ".lock")):
            return False
    return True
