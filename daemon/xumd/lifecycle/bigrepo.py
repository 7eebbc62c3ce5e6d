"""Big repositories: a new checkout inherits the main checkout's cone-mode
sparse-checkout patterns (only those directories are written), and its submodules are cloned
from the main checkout's own copies (`<common git dir>/modules/<name>`: a local clone that
hard-links the objects), so nothing is fetched and it works offline.

Sparse: `git worktree add --no-checkout`, then `sparse-checkout set --cone` in the new checkout
(git keeps it in that worktree's own `config.worktree`), then `read-tree -mu HEAD` writes only
the cone. A non-cone (pattern) sparse checkout is not inherited (its patterns are the user's
free-form rules; the checkout is then full): the result says nothing about sparse.

Submodules: only those the main checkout initialised (its modules directory exists); each is
cloned with the URL overridden for that one command to the local copy (`protocol.file.allow`
for that command only: git refuses local submodule clones by default since 2.38.1), then its
`origin` is set back to the URL the main checkout uses, so a later fetch or push there goes where
the user expects. A submodule that cannot be initialised (its commit is not in the local copy)
is reported `failed`; the checkout itself is usable, and the create succeeds.
"""

from __future__ import annotations

import os
from pathlib import Path

from xum_protocol.models.checkout_extras import SparseInfo, SubmoduleInfo

from xumd.base import logs
from xumd.system.git import Git

log = logs.get("xumd.lifecycle.bigrepo")


async def sparse_patterns(git: Git, repo: Path) -> SparseInfo | None:
    """The main checkout's cone patterns, or None when it is not a cone-mode sparse checkout."""
    if not _maybe_sparse(repo):
        return None
    enabled = await git.run(repo, "config", "--bool", "core.sparseCheckout", check=False)
    if not enabled.ok or enabled.output.text().strip() != "true":
        return None
    cone = await git.run(repo, "config", "--bool", "core.sparseCheckoutCone", check=False)
    if not cone.ok or cone.output.text().strip() != "true":
        log.info("bigrepo.sparse_not_cone", repo=str(repo))
        return None
    listed = await git.run(repo, "sparse-checkout", "list", check=False)
    if not listed.ok:
        return None
    patterns = [_unquote(line) for line in listed.output.text().splitlines() if line.strip()]
    return SparseInfo(cone=True, patterns=patterns)


def _maybe_sparse(repo: Path) -> bool:
    """False only when the main checkout certainly is not sparse, seen without running git:
    its git directory is `repo/.git` (a directory, no GIT_DIR in the environment) and has no
    `info/sparse-checkout` file. Without that file git does not treat the checkout as sparse
    (`sparse-checkout list` says so), whatever `core.sparseCheckout` says; this saves the
    `git config` process that every create ran."""
    if "GIT_DIR" in os.environ or "GIT_COMMON_DIR" in os.environ:
        return True
    gitdir = repo / ".git"
    if gitdir.is_symlink() or not gitdir.is_dir():
        return True  # a linked worktree or submodule (`.git` is a file): git decides
    return os.path.lexists(gitdir / "info" / "sparse-checkout")


_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, '"': 34, "\\": 92}
_OCTAL = frozenset("01234567")


def _unquote(line: str) -> str:
    """`sparse-checkout list` prints a directory whose name holds a quote, a backslash, a
    control or a non-ASCII byte C-quoted (`"\\303\\251"` for `é`): given back to `set` as
    printed, it would name another directory. Undecodable bytes round-trip (surrogateescape)."""
    if len(line) < 2 or not (line.startswith('"') and line.endswith('"')):
        return line
    body, out, i = line[1:-1], bytearray(), 0
    while i < len(body):
        ch, digits = body[i], body[i + 1 : i + 4]
        if ch != "\\" or i + 1 == len(body):
            out += ch.encode("utf-8", "surrogateescape")
            i += 1
        elif body[i + 1] in _ESCAPES:
            out.append(_ESCAPES[body[i + 1]])
            i += 2
        elif len(digits) == 3 and set(digits) <= _OCTAL:
            out.append(int(digits, 8) & 0xFF)
            i += 4
        else:
            out += ch.encode()
            i += 1
    return out.decode("utf-8", "surrogateescape")


async def apply_sparse(git: Git, repo: Path, checkout: Path, sparse: SparseInfo) -> None:
    """In a checkout added with `--no-checkout`: set the cone, then write only it."""
    await set_cone(git, repo, checkout, sparse.patterns)
    await git.run(checkout, "read-tree", "-mu", "HEAD", what="git read-tree (sparse checkout)")


async def set_cone(git: Git, repo: Path, checkout: Path, patterns: list[str]) -> None:
    """`git sparse-checkout set --cone`: it also writes the repository's shared config
    (extensions.worktreeConfig), so under the admin lock, as every other shared write of the
    daemon's (git's config lock is not retried like a ref's)."""
    async with git.admin_lock(repo):
        await git.run(
            checkout,
            "sparse-checkout",
            "set",
            "--cone",
            "--end-of-options",
            *patterns,
            what="git sparse-checkout set",
        )


async def _submodule_paths(git: Git, checkout: Path) -> list[tuple[str, str]]:
    """(name, path) of each submodule `.gitmodules` declares in the checkout."""
    if not (checkout / ".gitmodules").is_file():
        return []
    listed = await git.run(
        checkout,
        "config",
        "--file",
        ".gitmodules",
        "--null",
        "--get-regexp",
        r"^submodule\..*\.path$",
        check=False,
    )
    found: list[tuple[str, str]] = []
    for record in listed.output.text().split("\0"):
        key, _, path = record.partition("\n")
        if key.startswith("submodule.") and key.endswith(".path") and path:
            found.append((key[len("submodule.") : -len(".path")], path))
    return found


async def init_submodules(git: Git, repo: Path, checkout: Path) -> list[SubmoduleInfo]:
    paths = await _submodule_paths(git, checkout)
    if not paths:
        return []
    common = Path(await git.out(repo, "rev-parse", "--path-format=absolute", "--git-common-dir"))
    done: list[SubmoduleInfo] = []
    modules = os.path.realpath(common / "modules")
    for name, path in paths:
        local = common / "modules" / name
        # The names come from the branch's `.gitmodules` (anyone's commit): a name that climbs
        # out of the modules directory (`../../other-repo`) would make us clone some other
        # repository on this machine into the checkout. Git refuses such names itself, but only
        # later: the lookup here must not follow them.
        if _unsafe_name(name) or not os.path.realpath(local).startswith(modules + os.sep):
            done.append(SubmoduleInfo(path=path, status="failed", error="unsafe submodule name"))
            continue
        if not (local / "HEAD").is_file():
            done.append(SubmoduleInfo(path=path, status="skipped"))
            continue
        if not os.path.isdir(checkout / path):
            # Outside the sparse cone: git did not write its directory; nothing to fill.
            done.append(SubmoduleInfo(path=path, status="skipped"))
            continue
        done.append(await _init_one(git, repo, checkout, name, path, local=local))
    return done


def _unsafe_name(name: str) -> bool:
    parts = name.replace("\\", "/").split("/")
    return name.startswith("/") or any(part in ("", ".", "..") for part in parts)


async def _init_one(
    git: Git, repo: Path, checkout: Path, name: str, path: str, *, local: Path
) -> SubmoduleInfo:
    updated = await git.run(
        checkout,
        "-c",
        "protocol.file.allow=always",
        "-c",
        f"submodule.{name}.url={local}",
        "submodule",
        "update",
        "--init",
        "--no-fetch",
        "--",
        path,
        check=False,
    )
    if not updated.ok:
        tail = updated.output.tail_text(800).strip()
        log.warning("bigrepo.submodule_failed", checkout=str(checkout), path=path, error=tail)
        return SubmoduleInfo(path=path, status="failed", error=tail or updated.describe())
    real = await git.run(repo, "config", "--get", f"submodule.{name}.url", check=False)
    url = real.output.text().strip() if real.ok else ""
    if url:
        await git.run(checkout / path, "remote", "set-url", "origin", url, check=False)
    return SubmoduleInfo(path=path, status="initialized")
