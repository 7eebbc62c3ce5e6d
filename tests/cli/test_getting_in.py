"""Getting into a workspace: `xum ws path` (for `cd "$(xum ws path x)"`) and `xum ws open` (an
editor on the checkout), through the real CLI against a real daemon, with a fake editor script
that records its argv and working directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.lifecycle_helpers import add_project, create

XUM = [sys.executable, "-c", "from xum_client.cli import main; main()"]


def xum(daemon: DaemonProcess, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VISUAL", "EDITOR", "XUM_CLIENT_CONFIG", "XDG_CONFIG_HOME")
    }
    full.update({"XUM_ROOT": str(daemon.root), **env})
    return subprocess.run([*XUM, *args], capture_output=True, text=True, env=full, timeout=60)


def fake_editor(where: Path, name: str, code: int = 0) -> Path:
    """A script that writes its argv (one per line) and cwd to `where/<name>.argv`."""
    script = where / name
    script.write_text(
        "#!/bin/sh\n"
        f'out="{where}/{name}.argv"\n'
        'pwd > "$out"\n'
        'for a in "$@"; do printf "%s\\n" "$a" >> "$out"; done\n'
        f"exit {code}\n"
    )
    script.chmod(0o755)
    return script


def recorded(where: Path, name: str) -> list[str]:
    return (where / f"{name}.argv").read_text().splitlines()


@pytest.fixture
def ws(daemon: DaemonProcess, project: dict[str, Any]) -> dict[str, Any]:
    workspace: dict[str, Any] = create(daemon, project["id"], "there")["workspace"]
    return workspace


def test_path_prints_only_the_checkout_path(
    daemon: DaemonProcess, ws: dict[str, Any], project: dict[str, Any]
) -> None:
    for ref in (ws["id"], f"{project['name']}/there", "there"):
        done = xum(daemon, "ws", "path", ref)
        assert done.returncode == 0, done.stderr
        assert done.stdout == ws["path"] + "\n"
    # What the shell idiom does with it.
    env = {**os.environ, "XUM_ROOT": str(daemon.root)}
    cmd = " ".join(XUM).replace("from xum_client", "'from xum_client").replace("main()", "main()'")
    shell = subprocess.run(
        ["sh", "-c", f'cd "$({cmd} ws path there)" && pwd -P'],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert shell.stdout.strip() == os.path.realpath(ws["path"])


def test_path_of_an_archived_removed_or_unknown_workspace_fails_on_stderr(
    daemon: DaemonProcess, ws: dict[str, Any]
) -> None:
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    archived = xum(daemon, "ws", "path", ws["id"])
    assert archived.returncode == 1 and archived.stdout == ""
    assert "archived" in archived.stderr and "unarchive" in archived.stderr
    daemon.call("workspace.remove", {"workspace_id": ws["id"]})
    removed = xum(daemon, "ws", "path", ws["id"])
    assert removed.returncode == 3 and removed.stdout == "" and "not found" in removed.stderr
    unknown = xum(daemon, "ws", "path", "nosuch")
    assert unknown.returncode == 3 and unknown.stdout == ""


def test_path_of_a_name_two_projects_share_is_ambiguous(
    daemon: DaemonProcess, ws: dict[str, Any], tmp_short: Path
) -> None:
    from tests.support.gitrepo import make_repo

    other = add_project(daemon, make_repo(tmp_short / "other"))
    create(daemon, other["id"], "there")
    done = xum(daemon, "ws", "path", "there")
    assert done.returncode == 1 and done.stdout == ""
    assert "2 workspaces are named 'there'" in done.stderr


def test_path_of_a_checkout_missing_on_disk_fails(
    daemon: DaemonProcess, ws: dict[str, Any]
) -> None:
    Path(ws["path"]).rename(Path(ws["path"]).with_name("moved-away"))
    done = xum(daemon, "ws", "path", ws["id"])
    assert done.returncode == 1 and done.stdout == "" and "missing" in done.stderr


def test_open_uses_with_then_config_then_visual_then_editor(
    daemon: DaemonProcess, ws: dict[str, Any], tmp_short: Path
) -> None:
    for name in ("ed", "vis", "conf", "given"):
        fake_editor(tmp_short, name)
    env = {"EDITOR": f"{tmp_short}/ed --wait"}
    done = xum(daemon, "ws", "open", ws["id"], **env)
    assert done.returncode == 0, done.stderr
    assert recorded(tmp_short, "ed") == [os.path.realpath(ws["path"]), "--wait", ws["path"]]

    env["VISUAL"] = f"{tmp_short}/vis"
    assert xum(daemon, "ws", "open", ws["id"], **env).returncode == 0
    assert recorded(tmp_short, "vis")[1:] == [ws["path"]]

    config = tmp_short / "client.toml"
    config.write_text(f'[open]\ncommand = ["{tmp_short}/conf", "-n", "a b"]\n')
    env["XUM_CLIENT_CONFIG"] = str(config)
    assert xum(daemon, "ws", "open", ws["id"], **env).returncode == 0
    assert recorded(tmp_short, "conf")[1:] == ["-n", "a b", ws["path"]]

    with_ = xum(daemon, "ws", "open", ws["id"], "--with", f"{tmp_short}/given -x", **env)
    assert with_.returncode == 0
    assert recorded(tmp_short, "given")[1:] == ["-x", ws["path"]]


def test_open_reports_a_missing_or_failing_editor(
    daemon: DaemonProcess, ws: dict[str, Any], tmp_short: Path
) -> None:
    none = xum(daemon, "ws", "open", ws["id"])
    assert none.returncode == 1 and "no editor" in none.stderr and "$EDITOR" in none.stderr
    fake_editor(tmp_short, "bad", code=5)
    failing = xum(daemon, "ws", "open", ws["id"], EDITOR=f"{tmp_short}/bad")
    assert failing.returncode == 1 and "exited with 5" in failing.stderr
    missing = xum(daemon, "ws", "open", ws["id"], EDITOR=f"{tmp_short}/nope")
    assert missing.returncode == 1 and "cannot run" in missing.stderr
    broken = tmp_short / "broken.toml"
    broken.write_text("[open]\ncommand = 3\n")
    bad_config = xum(daemon, "ws", "open", ws["id"], XUM_CLIENT_CONFIG=str(broken))
    assert bad_config.returncode == 1 and "[open] command must be" in bad_config.stderr
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    archived = xum(daemon, "ws", "open", ws["id"], EDITOR=f"{tmp_short}/bad")
    assert archived.returncode == 1 and "archived" in archived.stderr
    assert len(recorded(tmp_short, "bad")) == 2  # its one run before: not run again
