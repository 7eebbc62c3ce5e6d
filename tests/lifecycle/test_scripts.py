"""Setup/teardown scripts: trust by exact hash, env, timeout with tree kill, bounded output."""

from __future__ import annotations

from pathlib import Path

from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import git
from tests.support.lifecycle_helpers import add_project, create, rpc_error
from tests.support.procs import alive, identify
from tests.support.wait import until


def with_config(repo: Path, text: str) -> None:
    (repo / ".xum").mkdir(exist_ok=True)
    (repo / ".xum" / "config.toml").write_text(text)
    git(repo, "add", ".xum")
    git(repo, "commit", "-q", "-m", "xum config")


SETUP = (
    "[scripts]\n"
    'setup = ["echo \\"setup $XUM_WORKSPACE_NAME $XUM_WORKSPACE_ID $XUM_ROOT\\" > setup.out",'
    ' "echo done-with-setup"]\n'
    'teardown = ["echo \\"bye $XUM_WORKSPACE_NAME\\" >> $XUM_ROOT/teardown.log"]\n'
)


def test_untrusted_config_is_not_run_until_trusted(daemon: DaemonProcess, repo: Path) -> None:
    with_config(repo, SETUP)
    project = add_project(daemon, repo)
    first = create(daemon, project["id"], "u")
    setup = first["setup"]
    assert setup["status"] == "untrusted"
    assert len(setup["config_hash"]) == 64
    assert f"xum project trust {project['id']} --hash {setup['config_hash']}" in setup["hint"]
    assert not (Path(first["workspace"]["path"]) / "setup.out").exists()
    shown = daemon.call("workspace.get", {"workspace_id": first["workspace"]["id"]})
    assert shown["workspace"]["setup"]["status"] == "untrusted"

    trusted = daemon.call("project.trust", {"project_id": project["id"]})
    assert trusted["config_hash"] == setup["config_hash"]
    assert trusted["project"]["trusted_config_hash"] == setup["config_hash"]
    second = create(daemon, project["id"], "t")
    ws = second["workspace"]
    assert second["setup"]["status"] == "ok"
    assert "done-with-setup" in second["setup"]["output"]
    out = (Path(ws["path"]) / "setup.out").read_text()
    assert out == f"setup t {ws['id']} {daemon.root}\n"
    got = daemon.call("workspace.get", {"workspace_id": ws["id"]})["workspace"]
    assert got["setup"]["status"] == "ok"
    assert "done-with-setup" in got["setup"]["output"]

    # teardown runs on archive (trusted), with the same environment
    daemon.call("workspace.archive", {"workspace_id": ws["id"]})
    assert (daemon.root / "teardown.log").read_text() == "bye t\n"


def test_changed_config_is_untrusted_again(daemon: DaemonProcess, repo: Path) -> None:
    with_config(repo, SETUP)
    project = add_project(daemon, repo)
    daemon.call("project.trust", {"project_id": project["id"]})
    with_config(repo, SETUP.replace("done-with-setup", "changed"))
    result = create(daemon, project["id"], "c")
    assert result["setup"]["status"] == "untrusted"
    assert "changed since it was trusted" in result["setup"]["error"]
    # trusting exactly the reported hash makes it run
    daemon.call(
        "project.trust", {"project_id": project["id"], "hash": result["setup"]["config_hash"]}
    )
    assert create(daemon, project["id"], "d")["setup"]["status"] == "ok"


def test_trust_errors(daemon: DaemonProcess, repo: Path) -> None:
    project = add_project(daemon, repo)
    assert rpc_error(daemon, "project.trust", {"project_id": project["id"]}).kind == (
        "invalid_state"
    )
    bad_hash = {"project_id": project["id"], "hash": "nothex"}
    assert rpc_error(daemon, "project.trust", bad_hash).kind == "invalid_params"
    missing = {"project_id": "prj_0123456789abcdef"}
    assert rpc_error(daemon, "project.trust", missing).kind == "not_found"


def test_failed_setup_is_reported_and_workspace_stays(daemon: DaemonProcess, repo: Path) -> None:
    with_config(repo, '[scripts]\nsetup = ["echo before", "echo oops >&2; exit 7", "echo never"]\n')
    project = add_project(daemon, repo)
    daemon.call("project.trust", {"project_id": project["id"]})
    result = create(daemon, project["id"], "f")
    assert result["setup"]["status"] == "failed"
    assert "exited with 7" in result["setup"]["error"]
    assert "oops" in result["setup"]["output"]
    assert "never" not in result["setup"]["output"]
    assert result["workspace"]["state"] == "active"


def test_setup_timeout_kills_the_whole_tree(tmp_short: Path, root: Path, repo: Path) -> None:
    write_config(root, "script_timeout_s = 1.0\nstop_grace_s = 0.5\n")
    daemon = DaemonProcess(root).start()
    try:
        with_config(
            repo,
            '[scripts]\nsetup = ["sleep 60 & echo $! > child.pid; trap \\"\\" TERM; sleep 60"]\n',
        )
        project = add_project(daemon, repo)
        daemon.call("project.trust", {"project_id": project["id"]})
        result = create(daemon, project["id"], "slow")
        assert result["setup"]["status"] == "timeout"
        assert "timed out" in result["setup"]["error"]
        # Identified as soon as its pid is known (it may be gone already: then it stays gone).
        child = identify(int((Path(result["workspace"]["path"]) / "child.pid").read_text()))
        until(lambda: not alive(child), 10, message="child gone")
    finally:
        daemon.close()


def test_output_is_bounded_with_head_and_tail(daemon: DaemonProcess, repo: Path) -> None:
    with_config(
        repo,
        "[scripts]\n"
        "setup = [\"echo FIRST; head -c 200000 /dev/zero | tr '\\\\\\\\0' x; echo; echo LAST\"]\n",
    )
    project = add_project(daemon, repo)
    daemon.call("project.trust", {"project_id": project["id"]})
    result = create(daemon, project["id"], "big")
    output = result["setup"]["output"]
    assert result["setup"]["status"] == "ok", result["setup"]
    assert len(output) < 40_000
    assert "FIRST" in output and "LAST" in output
    assert "bytes dropped" in output
