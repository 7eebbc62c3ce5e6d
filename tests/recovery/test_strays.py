"""`workspace.strays` (and `xum ws strays`, `xum strays`): checkouts and git admin entries under the
root that no row claims, with what they contain; never deleted. Also the CLI:
`xum ws ls` marks interrupted workspaces, `xum ws keep|rm` resolve them, `xum status` counts
them, `xum turn new|ls|end`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.crash.world import World
from tests.support.gitrepo import git

XUM = str(Path(sys.executable).parent / "xum")


def xum(world: World, *args: str) -> str:
    done = subprocess.run(
        [XUM, "--root", str(world.root), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def xum_json(world: World, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(xum(world, "--json", *args))
    return result


def test_strays_are_listed_with_their_content_and_never_deleted(world: World) -> None:
    world.start()
    world.add_project()
    world.create("claimed")
    wdir = world.root / "workspaces" / "repo"
    # A worktree made by hand under the root, with uncommitted work.
    git(world.repo, "worktree", "add", "-q", "-b", "by-hand", str(wdir / "manual"))
    (wdir / "manual" / "new.txt").write_text("work\n")
    (wdir / "manual" / "README.md").write_text("changed\n")
    # A worktree whose checkout was deleted by hand: only git's admin entry is left.
    git(world.repo, "worktree", "add", "-q", "-b", "gone", str(wdir / "gone"))
    shutil.rmtree(wdir / "gone")
    # A plain directory, and a worktree outside the root (the user's own: not ours).
    (wdir / "plain").mkdir()
    (wdir / "plain" / "a.txt").write_text("a\n")
    git(world.repo, "worktree", "add", "-q", "-b", "outside", str(world.base / "outside"))
    found = {Path(s["path"]).name: s for s in world.call("workspace.strays", {})["strays"]}
    assert set(found) == {"manual", "gone", "plain"}
    manual = found["manual"]
    assert manual["kind"] == "checkout" and manual["exists"] and manual["branch"] == "by-hand"
    assert sorted(manual["uncommitted"]) == ["README.md", "new.txt"]
    assert manual["files"] >= 4 and manual["admin_dir"].endswith("worktrees/manual")
    gone = found["gone"]
    assert gone["kind"] == "admin_entry" and not gone["exists"] and gone["branch"] == "gone"
    plain = found["plain"]
    assert plain["files"] == 1 and plain["admin_dir"] is None and plain["uncommitted"] == []
    assert world.call("daemon.status")["details"]["recovery"]["strays"] == 3
    # A restart (the startup pass) counts them and deletes nothing.
    world.start()
    assert world.call("daemon.status")["details"]["recovery"]["strays"] == 3
    assert (wdir / "manual" / "new.txt").read_text() == "work\n"
    assert (world.repo / ".git" / "worktrees" / "gone").is_dir()
    assert (wdir / "plain" / "a.txt").exists()
    human = xum(world, "ws", "strays")
    assert "manual" in human and "branch by-hand" in human and "2 uncommitted" in human
    assert xum_json(world, "strays", "--project", "repo")["strays"][0]["path"].endswith("gone")


def test_cli_interrupted_status_keep_rm_and_turns(world: World) -> None:
    world.start()
    world.add_project()
    owner = world.create("owner")
    world.start("workspace.create.after_checkout")
    world.expect_killed("turn.create", {"owner_workspace_id": owner["id"], "mode": "new"})
    world.start("workspace.create.after_intent")
    world.expect_killed("workspace.create", {"project_id": world.project_id, "name": "half"})
    world.start()
    listing = xum(world, "ws", "ls")
    interrupted = [line for line in listing.splitlines() if "(interrupted)" in line]
    assert len(interrupted) == 2, listing
    status = xum(world, "status")
    assert re.search(r"^interrupted:\s+2$", status, re.M), status
    target = next(w for w in world.workspaces() if w["handle_id"])
    assert "kept" in xum(world, "ws", "keep", target["id"])
    assert "removed" in xum(world, "ws", "rm", "repo/half")
    assert xum_json(world, "status")["details"]["recovery"]["interrupted"] == 0
    # Turns through the CLI (the owner addressed as PROJECT/NAME).
    turns = xum(world, "turn", "ls", "repo/owner")
    assert target["handle_id"] in turns and "open" in turns
    made = xum_json(world, "turn", "new", "repo/owner", "--name", "sub2")
    assert made["workspace"]["name"] == "sub2"
    again = xum_json(world, "turn", "new", "repo/owner", "--existing", "repo/sub2")
    assert again["turn"]["mode"] == "existing"
    assert "ended" in xum(world, "turn", "end", again["turn"]["id"])
    shown = xum(world, "turn", "show", again["turn"]["id"])
    assert "ended" in shown
    assert len(xum_json(world, "turn", "ls", owner["id"])["turns"]) == 3
