"""Audit: a failed create takes back only the branch *it* made, never a concurrent create's.

Two creates name one new branch. Both plan it as new (it does not exist yet); the first to get
the repository's admin lock makes it with `git worktree add -b`; the second's add fails ("a
branch named ... already exists"). The second's undo must not delete the first's branch: it
points where the second would have created it (the same base), so a plain "still at base" check
cannot tell them apart.

Deterministic order: a third create holds the repository's admin lock inside its post-checkout
hook until both racing creates have committed their intent rows (so both planned the branch).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from xum_client.errors import XumRpcError

from tests.support.daemon import DaemonProcess
from tests.support.gitrepo import git
from tests.support.lifecycle_helpers import assert_git_healthy, branch_exists, create, worktrees
from tests.support.wait import until


def test_failed_create_keeps_the_branch_a_concurrent_create_made(
    daemon: DaemonProcess, repo: Path, project: dict[str, Any], tmp_short: Path
) -> None:
    ctl = tmp_short / "ctl"
    ctl.mkdir()
    hook = repo / ".git" / "hooks" / "post-checkout"
    # Only the gate workspace's checkout blocks (bounded: 20 s), holding the admin lock.
    hook.write_text(
        "#!/bin/sh\n"
        'case "$PWD" in */gate) ;; *) exit 0 ;; esac\n'
        f"touch {ctl}/gate-started\n"
        f"i=0; while [ ! -f {ctl}/go ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done\n"
        "exit 0\n"
    )
    hook.chmod(0o755)

    results: dict[str, Any] = {}

    def run(name: str, **extra: Any) -> None:
        try:
            results[name] = create(daemon, project["id"], name, **extra)
        except XumRpcError as exc:
            results[name] = exc

    threads = [threading.Thread(target=run, args=("gate",))]
    threads[0].start()
    until((ctl / "gate-started").exists, message="the gate create's hook")
    for name in ("one", "two"):
        thread = threading.Thread(target=run, args=(name,), kwargs={"branch": "feature"})
        thread.start()
        threads.append(thread)

    def both_planned() -> bool:
        listed = daemon.call("workspace.list")["workspaces"]
        return {w["name"] for w in listed if w["state"] == "creating"} >= {"one", "two"}

    until(both_planned, message="both racing creates to commit their intent")
    (ctl / "go").touch()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()

    assert not isinstance(results["gate"], XumRpcError), results["gate"]
    won = [n for n in ("one", "two") if not isinstance(results[n], XumRpcError)]
    lost = [n for n in ("one", "two") if isinstance(results[n], XumRpcError)]
    assert len(won) == 1 and len(lost) == 1, results
    winner = results[won[0]]["workspace"]
    assert results[lost[0]].kind == "conflict", results[lost[0]]
    # The winner's branch survives the loser's undo, and its checkout is still on it.
    assert branch_exists(repo, "feature")
    assert git(Path(winner["path"]), "symbolic-ref", "HEAD").strip() == "refs/heads/feature"
    git(Path(winner["path"]), "rev-parse", "--verify", "HEAD")
    listed = {w["name"]: w for w in daemon.call("workspace.list")["workspaces"]}
    assert set(listed) == {"gate", won[0]}
    assert winner["path"] in worktrees(repo)
    hook.unlink()
    assert_git_healthy(repo)
