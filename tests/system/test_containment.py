"""Process containment across crashes (docs/RELIABILITY.md): every script and supervised process,
and every descendant (double-forked into its own session too), is found again by its marker;
the start-up pass stops what a crashed daemon left running before it reconciles anything.

Real daemons, real scripts, real SIGKILL; the only fault injected is a signal that cannot be
delivered (a process that survives SIGKILL cannot be made on purpose).
"""

from __future__ import annotations

import errno
import gc
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import psutil
import pytest
from xumd.checkouts.marker import WorkspaceRef
from xumd.cleanup.steps import teardown_outcome
from xumd.lifecycle.scripts import ScriptRunner
from xumd.system import containment
from xumd.system.containment import Containment, Marker, root_tag
from xumd.system.git import Git
from xumd.system.platform import linux
from xumd.system.procutil import run_command

from tests.support.cgroups import delegated_cgroup
from tests.support.daemon import DaemonProcess, write_config
from tests.support.gitrepo import git, make_repo
from tests.support.lifecycle_helpers import add_project, create
from tests.support.platform import BACKEND, PORTABLE, fail_process_read
from tests.support.procs import ProcId, alive, changed_signals, identify, identify_all
from tests.support.wait import until

NO_CGROUP = "marker" if PORTABLE else "subreaper+marker"
"""The mechanism without a cgroup: the portable backend has no subreaper either."""
UNUSABLE_DIR = "no cgroups on the portable" if PORTABLE else "no cgroup.procs"
"""Why a configured plain directory is no cgroup to run in."""

T = TypeVar("T")


def run_async(fn: Callable[[], Awaitable[T]]) -> T:
    """anyio.run, collecting the finished subprocess transports while the loop still runs (their
    finalizer needs an open loop; one finalized later, during a compile, upsets CPython 3.11)."""

    async def main() -> T:
        try:
            return await fn()
        finally:
            gc.collect()

    return anyio.run(main)


def zombie_children(pid: int) -> list[int]:
    try:
        children = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []
    found = []
    for child in children:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                found.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.fixture
def reap_strays() -> Iterator[list[int]]:
    """Pids a test started: killed at the end whatever happened (no test leaves a sleeper)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


def with_scripts(repo: Path, **scripts: list[str]) -> None:
    lines = "".join(f"{key} = {json.dumps(value)}\n" for key, value in scripts.items())
    (repo / ".xum").mkdir(exist_ok=True)
    (repo / ".xum" / "config.toml").write_text(f"[scripts]\n{lines}")
    git(repo, "add", ".xum")
    git(repo, "commit", "-q", "-m", "scripts")


def trusted(daemon: DaemonProcess, repo: Path) -> dict[str, Any]:
    project = add_project(daemon, repo)
    daemon.call("project.trust", {"project_id": project["id"]})
    return project


def at_least(count: int, found: list[containment.Marked]) -> list[containment.Marked] | None:
    """`found` when it holds `count` processes or more: one scan decides and is returned (two
    scans could disagree when a process comes or goes between them)."""
    return found if len(found) >= count else None


def marked(root: Path, prefix: str = "") -> list[containment.Marked]:
    """Processes carrying a marker of this root (whose record starts with `prefix`: `lease_`
    for setup/teardown commands, `cmd-` for git, `proc_` for supervised processes)."""
    return containment.scan(root_tag(root), lambda m: m.record.startswith(prefix))


# -- through a real daemon ---------------------------------------------------------------------


def test_status_names_the_mechanism(daemon: DaemonProcess) -> None:
    details = daemon.call("daemon.status")["details"]["containment"]
    # This machine has cgroup v1 without delegation: subreaper + marker is what holds (the
    # marker alone on the portable backend, which has no subreaper).
    assert details["mechanism"] == NO_CGROUP
    assert details["subreaper"] is not PORTABLE
    assert details["marker"] == "XUM_RUN"
    from xum_client.cli import _status_lines

    lines = dict(_status_lines(daemon.call("daemon.status")))
    assert lines["containment"] == NO_CGROUP
    escaped = {**details, "escaped": [{"pid": 42, "marker": "m", "argv": ["sleep"]}]}
    shown = dict(
        _status_lines({**daemon.call("daemon.status"), "details": {"containment": escaped}})
    )
    assert shown["containment"] == f"{NO_CGROUP}; 1 process(es) could not be stopped (pid 42)"


def test_setup_child_of_a_crashed_daemon_is_stopped_before_the_restart_is_ready(
    root: Path, tmp_short: Path, reap_strays: list[int]
) -> None:
    """The reported case: a setup leaves a background child that writes into the checkout later;
    the daemon is SIGKILLed. The restarted daemon stops it before it is ready (before recovery
    flags the row), so `late.txt` can never appear in the interrupted checkout."""
    repo = make_repo(tmp_short / "repo")
    with_scripts(repo, setup=["(sleep 30; echo late > late.txt) & sleep 60"])
    daemon = DaemonProcess(root).start()
    try:
        project = trusted(daemon, repo)
        errors: list[BaseException] = []

        def call() -> None:
            try:
                create(daemon, project["id"], "crashy")
            except BaseException as exc:  # the daemon dies under the call
                errors.append(exc)

        creating = threading.Thread(target=call)
        creating.start()
        # The subshell and its sleep, and the script's own sleep, carry the run's marker.
        found = until(
            lambda: at_least(3, marked(root, "lease_")),
            message="setup to run",
        )
        procs = identify_all(m.pid for m in found)
        reap_strays.extend(p.pid for p in procs)
        assert all(m.marker.record.startswith("lease_") for m in found)
        (leader,) = [p for p in procs if os.getsid(p.pid) == p.pid]  # it leads its session
        daemon.kill()
        creating.join(20)
        if PORTABLE:
            # No parent-death signal: the script's shell outlives the daemon too, until the
            # restart's sweep below stops it with the rest (stated in the backend's `weaker`).
            assert alive(leader)
        else:
            # The script's shell dies with the daemon (parent-death signal); its children not.
            until(lambda: not alive(leader), timeout=5, message="the parent-death signal")
        # What the restart must stop: every marked process alive now, scanned afresh (the scan
        # above waited for three of them; a shell that does not exec its last command makes a
        # fourth, which may not have been seen yet: counting from that first scan was flaky).
        survivors = identify_all(m.pid for m in marked(root, "lease_"))
        reap_strays.extend(p.pid for p in survivors)
        assert survivors, "a background child survives the SIGKILL"

        daemon.start()
        assert [p for p in survivors if alive(p)] == []
        assert marked(root) == []
        status = daemon.call("daemon.status")["details"]["containment"]
        assert status["stopped_at_start"] == len(survivors)
        assert status["escaped"] == []
        log = daemon.log_text()
        # The sweep ran before the recovery pass flagged the row.
        restart = log.rindex("containment.mechanism")
        assert log.index("containment.sweep", restart) < log.index("recovery", restart)
        (ws,) = daemon.call("workspace.list", {})["workspaces"]
        assert ws["interrupted"] is True
        assert not (Path(ws["path"]) / "late.txt").exists()
    finally:
        daemon.close()


def test_setup_that_ignores_the_parent_death_signal_is_stopped_at_the_restart(
    root: Path, tmp_short: Path, reap_strays: list[int]
) -> None:
    """A setup whose shell ignores SIGTERM outlives the daemon's SIGKILL itself (the parent-death
    signal is SIGTERM): the sweep SIGKILLs it after the grace, so its lease is reclaimed and the
    workspace is not held by it."""
    repo = make_repo(tmp_short / "repo")
    with_scripts(repo, setup=["trap '' TERM; sleep 60"])
    daemon = DaemonProcess(root).start()
    try:
        project = trusted(daemon, repo)
        creating = threading.Thread(target=_quiet, args=(create, daemon, project["id"], "t"))
        creating.start()
        found = until(
            lambda: at_least(2, marked(root, "lease_")),
            message="setup to run",
        )
        procs = identify_all(m.pid for m in found)
        reap_strays.extend(p.pid for p in procs)
        daemon.kill()
        creating.join(20)
        assert all(alive(p) for p in procs), "both survive the crash"
        daemon.start()
        assert not any(alive(p) for p in procs)
        assert daemon.call("lease.list", {})["leases"] == []
        status = daemon.call("daemon.status")["details"]["containment"]
        assert status["stopped_at_start"] == len(procs)
    finally:
        daemon.close()


def test_git_hook_child_of_a_crashed_daemon_is_stopped_at_the_restart(
    root: Path, tmp_short: Path, reap_strays: list[int]
) -> None:
    """git runs hooks (post-checkout during `worktree add`); git itself dies with the daemon
    (parent-death signal), its hook's children do not, and carry the command's marker."""
    repo = make_repo(tmp_short / "repo")
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text("#!/bin/sh\n(setsid sleep 100 &)\nsleep 60\n")
    hook.chmod(0o755)
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        creating = threading.Thread(target=_quiet, args=(create, daemon, project["id"], "g"))
        creating.start()
        found = until(
            lambda: at_least(3, marked(root, "cmd-")),
            message="the hook to run",
        )
        procs = identify_all(m.pid for m in found)
        reap_strays.extend(p.pid for p in procs)
        assert all(m.marker.record.startswith("cmd-") for m in found)
        daemon.kill()
        creating.join(20)
        survivors = [p for p in procs if alive(p)]
        assert survivors, "the hook's children survive the crash"
        daemon.start()
        assert [p for p in survivors if alive(p)] == []
        assert marked(root) == []
    finally:
        daemon.close()


def test_teardown_double_fork_is_stopped_before_cleanup_completes(
    root: Path, tmp_short: Path, reap_strays: list[int]
) -> None:
    """A teardown that double-forks into its own session escapes the group and the tree kill;
    its marker still finds it, and the remove reports `completed` only once it is gone."""
    repo = make_repo(tmp_short / "repo")
    ctl = tmp_short / "ctl"
    ctl.mkdir()
    teardown = (
        f"sleep 100 & setsid sh -c 'echo $$ > {ctl}/escapee; exec sleep 100' & "
        f"until [ -s {ctl}/escapee ]; do sleep 0.01; done"
    )
    with_scripts(repo, teardown=[teardown])
    daemon = DaemonProcess(root).start()
    try:
        project = trusted(daemon, repo)
        ws = create(daemon, project["id"], "esc")["workspace"]
        result = daemon.call("workspace.remove", {"workspace_id": ws["id"]})
        escapee = identify(int((ctl / "escapee").read_text()))
        reap_strays.append(escapee.pid)
        assert os.getsid(escapee.pid) == escapee.pid if alive(escapee) else True
        assert result["cleanup"]["status"] == "completed", result["cleanup"]
        assert not alive(escapee), "the double-forked teardown child outlived the remove"
        assert marked(root) == []
        # It was re-parented to the daemon (subreaper), which reaps it: no zombie is left.
        until(lambda: not zombie_children(daemon.pid), timeout=5, message="orphans reaped")
    finally:
        daemon.close()


def test_supervised_process_double_fork_is_stopped_with_it(
    daemon: DaemonProcess, tmp_short: Path, reap_strays: list[int]
) -> None:
    repo = make_repo(tmp_short / "repo")
    project = add_project(daemon, repo)
    ws = create(daemon, project["id"], "sup")["workspace"]
    pidfile = tmp_short / "escapee"
    proc = daemon.call(
        "process.spawn",
        {
            "workspace_id": ws["id"],
            "kind": "agent",
            "argv": [
                "sh",
                "-c",
                # Orphaned at once (its subshell exits): out of the group and the tree.
                f"(setsid sh -c 'echo $$ > {pidfile}; exec sleep 100' &); exec sleep 100",
            ],
        },
    )["process"]
    until(lambda: pidfile.exists() and pidfile.read_text().strip(), message="double fork")
    escapee = identify(int(pidfile.read_text()))
    reap_strays.append(escapee.pid)
    assert alive(escapee)
    daemon.call("process.stop", {"process_id": proc["id"], "grace_s": 1})
    until(lambda: not alive(escapee), timeout=10, message="the escapee to be stopped")


def test_shutdown_during_a_hanging_teardown_leaves_nothing_running(
    root: Path, tmp_short: Path, reap_strays: list[int]
) -> None:
    """A teardown that never exits while the daemon shuts down: it and its double-forked child
    are stopped by the shutdown (bounded), or at the latest by the next start."""
    repo = make_repo(tmp_short / "repo")
    ctl = tmp_short / "ctl"
    ctl.mkdir()
    # The escapee is orphaned (its parent subshell exits) before the shutdown: no tree walk
    # from the teardown's shell reaches it any more, only its marker.
    teardown = f"(setsid sh -c 'exec sleep 100' &); echo started > {ctl}/started; exec sleep 100"
    with_scripts(repo, teardown=[teardown])
    # Short waits: the in-flight remove is cancelled at once, the tree gets a short grace.
    write_config(root, "shutdown_grace_s = 0.5\nstop_grace_s = 1.0\n")
    daemon = DaemonProcess(root).start()
    try:
        project = trusted(daemon, repo)
        ws = create(daemon, project["id"], "hang")["workspace"]
        done: list[Any] = []
        remover = threading.Thread(
            target=lambda: done.append(
                _quiet(daemon.call, "workspace.remove", {"workspace_id": ws["id"]})
            )
        )
        remover.start()
        until(lambda: len(marked(root, "lease_")) >= 2, message="the teardown and its escapee")
        reap_strays.extend(m.pid for m in marked(root))
        assert daemon.terminate(timeout=30) == 0
        remover.join(20)
        assert marked(root) == []
    finally:
        daemon.close()


def _quiet(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        return exc


def test_a_crashed_daemons_kept_process_is_adopted_not_swept(
    root: Path, tmp_short: Path, reap_strays: list[int]
) -> None:
    """Only scripts' and commands' leftovers are swept: a live supervised process (and its
    tree, marked with its id) is adopted by the next daemon."""
    repo = make_repo(tmp_short / "repo")
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "keep")["workspace"]
        agent = daemon.call(
            "process.spawn",
            {"workspace_id": ws["id"], "kind": "agent", "argv": ["sleep", "100"]},
        )["process"]
        reap_strays.append(agent["pid"])
        held = identify(agent["pid"])
        daemon.kill()
        daemon.start()
        assert alive(held)
        listed = daemon.call("process.list", {})["processes"]
        assert [p["id"] for p in listed if p["adopted"]] == [agent["id"]]
        assert daemon.call("daemon.status")["details"]["containment"]["stopped_at_start"] == 0
    finally:
        daemon.close()


# -- in-process: the rules, and the paths a real process cannot be made to take -----------------


def _sleeper(env_marker: str | None) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    if env_marker is not None:
        env[containment.MARKER_VAR] = env_marker
    return subprocess.Popen(["sleep", "100"], env=env)


def test_sweep_stops_only_another_instances_markers_of_this_root(tmp_short: Path) -> None:
    cont = Containment(tag=root_tag(tmp_short))
    previous = Marker(cont.tag, "previousrun", "lease_0123")
    kept = Marker(cont.tag, "previousrun", "proc_0123")
    procs = {
        "previous": _sleeper(str(previous)),
        "kept": _sleeper(str(kept)),
        "ours": _sleeper(str(cont.marker("lease_4567"))),
        "other_root": _sleeper(str(Marker(root_tag(tmp_short / "x"), "run", "lease_1"))),
        "unmarked": _sleeper(None),
    }
    try:
        left = run_async(lambda: cont.sweep(lambda m: m == kept, 1.0))
        assert left == []
        for name, proc in procs.items():
            if name == "previous":
                assert proc.wait(5) == -signal.SIGTERM
            else:
                assert proc.poll() is None, name
        assert [s["pid"] for s in cont.swept] == [procs["previous"].pid]
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_a_recycled_pid_is_never_signalled(tmp_short: Path) -> None:
    """The pidfd pins the process: one whose marker or start time differs from the scan's is
    left alone (as a pid recycled between the scan and the signal would be)."""
    cont = Containment(tag=root_tag(tmp_short))
    marker = Marker(cont.tag, "previousrun", "lease_9")
    proc = _sleeper(str(marker))
    try:
        until(lambda: containment.read_marker(proc.pid) == marker)
        (found,) = containment.scan(cont.tag)
        assert found.start is not None
        stale = containment.Marked(found.pid, found.marker, found.start - 100.0)
        other = containment.Marked(found.pid, Marker(cont.tag, "x", "lease_8"), found.start)
        assert run_async(lambda: containment.stop_marked([stale, other], 0.2)) == []
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_git_hook_double_fork_is_stopped_after_the_command(tmp_short: Path) -> None:
    repo = make_repo(tmp_short / "repo")
    pidfile = tmp_short / "hookchild"
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\nsetsid sh -c 'echo $$ > {pidfile}; exec sleep 100' &\n")
    hook.chmod(0o755)
    cont = Containment(tag=root_tag(tmp_short))
    runner = Git(containment=cont)
    try:
        run_async(lambda: runner.run(repo, "checkout", "-q", "-b", "hooked"))
        pid = int(until(lambda: pidfile.exists() and pidfile.read_text().strip()))
        assert not alive(identify(pid))
        assert containment.scan(cont.tag) == []
    finally:
        for m in containment.scan(cont.tag):
            os.kill(m.pid, signal.SIGKILL)


def test_teardown_escapee_that_cannot_be_stopped_fails_the_step_naming_it(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch, reap_strays: list[int]
) -> None:
    """Fail closed: the teardown's obligation stays pending (a failed step), naming the pid,
    which is what `cleanup.list` shows as last_error. The fault: signals to it are lost."""
    checkout = tmp_short / "co"
    checkout.mkdir()
    pidfile = tmp_short / "escapee"
    real = containment.send_signal

    def lossy(pidfd: int, pid: int, sig: int) -> None:
        if pidfile.exists() and pid == int(pidfile.read_text()):
            return
        real(pidfd, pid, sig)

    monkeypatch.setattr(containment, "send_signal", lossy)
    runner = ScriptRunner(
        store=None,  # type: ignore[arg-type]
        root=tmp_short,
        timeout_s=10,
        grace_s=0.2,
        leases=None,
        containment=Containment(tag=root_tag(tmp_short)),
    )
    ref = WorkspaceRef("ws_1", "proj_1", "w", checkout, "inc")
    command = (
        f"setsid sh -c 'echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep 100' "
        ">/dev/null 2>&1 & "
        # Until it *is* `sleep`: its pid is written just before the exec, and the escapee is
        # named by its argv as the teardown ends (a loaded machine ran the check in between).
        f"until [ -s {pidfile} ] && grep -qx sleep /proc/$(cat {pidfile})/comm 2>/dev/null; "
        "do sleep 0.01; done"
    )
    try:
        outcome = run_async(
            lambda: runner._run_commands(
                "teardown", [command], "h", ref, checkout, None, dict(os.environ)
            )
        )
        pid = int(pidfile.read_text())
        reap_strays.append(pid)
        escapee = identify(pid)
        assert outcome.status == "failed"
        assert outcome.error is not None and f"pid {pid} (sleep 100)" in outcome.error
        assert alive(escapee)
        step = teardown_outcome(outcome.status, outcome.error, outcome.output)
        assert step.state != "completed" and f"pid {pid}" in (step.error or "")
        assert runner.containment.status()["escaped"][0]["pid"] == pid

        # The retry (another run of the teardown) does not succeed while it still runs...
        again = run_async(
            lambda: runner._run_commands(
                "teardown", ["true"], "h", ref, checkout, None, dict(os.environ)
            )
        )
        assert again.status == "failed"
        assert again.error is not None and f"pid {pid} (sleep 100)" in again.error
        assert "earlier teardown run" in again.error
        # ...and does once it could be stopped after all.
        monkeypatch.setattr(containment, "send_signal", real)
        third = run_async(
            lambda: runner._run_commands(
                "teardown", ["true"], "h", ref, checkout, None, dict(os.environ)
            )
        )
        assert third.status == "ok", third.error
        assert not alive(escapee)
    finally:
        monkeypatch.setattr(containment, "send_signal", real)


def test_run_command_stops_a_double_fork_without_a_subreaper(tmp_short: Path) -> None:
    pidfile = tmp_short / "escapee"
    cont = Containment(tag=root_tag(tmp_short))
    result = run_async(
        lambda: run_command(
            ["/bin/sh", "-c", f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 100' &"],
            timeout_s=10,
            grace_s=0.5,
            containment=cont,
            marker=cont.marker("lease_x"),
        )
    )
    assert result.ok and result.escaped == []
    pid = int(until(lambda: pidfile.exists() and pidfile.read_text().strip()))
    assert not alive(identify(pid))


# -- a cgroup per run (where one is delegated; here a directory of the host's cgroup v2) ----------


@pytest.fixture
def cgroup_base() -> Iterator[Path]:
    with delegated_cgroup() as base:
        yield base


def _runs(base: Path) -> list[str]:
    return [p.name for p in base.rglob("run-*")]


def _without_cgroups(daemon: DaemonProcess, containment_status: dict[str, Any]) -> None:
    """The portable backend refuses a configured cgroup and says so: in containment's
    `degraded`, and in the platform's `weaker` (a descendant that clears its environment and
    leaves its session is found again by nothing)."""
    assert containment_status["cgroup"] is None
    assert containment_status["mechanism"] == "marker"
    assert UNUSABLE_DIR in containment_status["degraded"], containment_status
    weaker = daemon.call("daemon.status")["details"]["platform"]["weaker"]
    assert any("clears its environment" in line for line in weaker), weaker


def test_cgroup_contains_a_teardown_child_that_drops_its_environment(
    root: Path, tmp_short: Path, cgroup_base: Path, reap_strays: list[int]
) -> None:
    """Without a marker (env -i) and out of the group and the tree, only the cgroup still holds
    the escapee: the remove completes only once it is gone, and the run's cgroup goes too."""
    repo = make_repo(tmp_short / "repo")
    ctl = tmp_short / "ctl"
    ctl.mkdir()
    teardown = (
        "(env -i /usr/bin/setsid /bin/sh -c "
        f"'echo $$ > {ctl}/escapee.tmp; mv {ctl}/escapee.tmp {ctl}/escapee; exec /bin/sleep 100'"
        " >/dev/null 2>&1 &); "
        f"until [ -s {ctl}/escapee ]; do sleep 0.01; done"
    )
    with_scripts(repo, teardown=[teardown])
    write_config(root, f'[processes]\ncgroup = "{cgroup_base}"\n')
    daemon = DaemonProcess(root).start()
    try:
        status = daemon.call("daemon.status")["details"]["containment"]
        if PORTABLE:
            _without_cgroups(daemon, status)
            project = trusted(daemon, repo)
            ws = create(daemon, project["id"], "cg")["workspace"]
            result = daemon.call("workspace.remove", {"workspace_id": ws["id"]})
            escapee = identify(int((ctl / "escapee").read_text()))
            reap_strays.append(escapee.pid)
            assert result["cleanup"]["status"] == "completed", result["cleanup"]
            # What daemon.status says the backend cannot do: nothing finds it again.
            assert alive(escapee) and containment.read_marker(escapee.pid) is None
            return
        assert status["mechanism"] == "cgroup+subreaper+marker"
        assert status["cgroup"] == str(cgroup_base)
        project = trusted(daemon, repo)
        ws = create(daemon, project["id"], "cg")["workspace"]
        result = daemon.call("workspace.remove", {"workspace_id": ws["id"]})
        escapee = identify(int((ctl / "escapee").read_text()))
        reap_strays.append(escapee.pid)
        assert containment.read_marker(escapee.pid) is None if alive(escapee) else True
        assert result["cleanup"]["status"] == "completed", result["cleanup"]
        assert not alive(escapee), "the escapee without a marker outlived the remove"
        assert _runs(cgroup_base) == []
        # Found by its cgroup alone, and still named in the teardown step's record.
        listed = daemon.call("cleanup.list", {"workspace_id": ws["id"]})["obligations"]
        (step,) = [o for o in listed if o["kind"] == "teardown"]
        (stopped,) = step["detail"]["leftovers"]
        assert stopped["pid"] == escapee.pid and stopped["argv"] == ["/bin/sleep", "100"], step
        assert stopped["signal"] == "SIGTERM", step
    finally:
        daemon.close()


def test_cgroup_of_a_crashed_daemons_setup_is_emptied_at_the_restart(
    root: Path, tmp_short: Path, cgroup_base: Path, reap_strays: list[int]
) -> None:
    repo = make_repo(tmp_short / "repo")
    ctl = tmp_short / "ctl"
    ctl.mkdir()
    setup = f"(env -i /bin/sh -c 'echo $$ > {ctl}/bg; exec /bin/sleep 100' &); sleep 60"
    with_scripts(repo, setup=[setup])
    write_config(root, f'[processes]\ncgroup = "{cgroup_base}"\n')
    daemon = DaemonProcess(root).start()
    try:
        project = trusted(daemon, repo)
        creating = threading.Thread(target=_quiet, args=(create, daemon, project["id"], "c"))
        creating.start()
        bg = identify(
            int(until(lambda: (ctl / "bg").exists() and (ctl / "bg").read_text().strip()))
        )
        reap_strays.append(bg.pid)
        if PORTABLE:
            _without_cgroups(daemon, daemon.call("daemon.status")["details"]["containment"])
            assert _runs(cgroup_base) == []
        else:
            (run,) = _runs(cgroup_base)
            assert run.startswith("run-lease_")
        daemon.kill()
        creating.join(20)
        assert alive(bg) and containment.read_marker(bg.pid) is None
        daemon.start()
        # The portable backend has nothing that finds it (daemon.status says so); the restart's
        # sweep still stops every marked process of the crashed setup.
        assert alive(bg) is PORTABLE
        assert marked(root, "lease_") == []
        assert _runs(cgroup_base) == []
        assert daemon.call("daemon.status")["details"]["containment"]["stopped_at_start"] >= 1
    finally:
        daemon.close()


def test_supervised_process_runs_in_its_own_cgroup(
    root: Path, tmp_short: Path, cgroup_base: Path
) -> None:
    repo = make_repo(tmp_short / "repo")
    write_config(root, f'[processes]\ncgroup = "{cgroup_base}"\n')
    daemon = DaemonProcess(root).start()
    try:
        project = add_project(daemon, repo)
        ws = create(daemon, project["id"], "p")["workspace"]
        proc = daemon.call(
            "process.spawn", {"workspace_id": ws["id"], "kind": "agent", "argv": ["sleep", "100"]}
        )["process"]
        own = f"/run-{proc['id']}"
        if PORTABLE:
            _without_cgroups(daemon, daemon.call("daemon.status")["details"]["containment"])
            assert not Path(f"/proc/{proc['pid']}/cgroup").read_text().strip().endswith(own)
        else:
            until(lambda: Path(f"/proc/{proc['pid']}/cgroup").read_text().strip().endswith(own))
        daemon.call("process.stop", {"process_id": proc["id"], "grace_s": 1})
        until(lambda: _runs(cgroup_base) == [], timeout=10, message="its cgroup removed")
    finally:
        daemon.close()


def test_delegated_cgroup_detection(tmp_short: Path) -> None:
    """Only a pure cgroup v2 host with our own, writable, non-root cgroup counts as delegated;
    a configured path that is no cgroup falls back (markers and subreaper still hold)."""
    mount = tmp_short / "cg"
    own = mount / "user.slice" / "xumd.service"
    own.mkdir(parents=True)
    (mount / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.procs").write_text("")
    proc = tmp_short / "cgroup"
    proc.write_text("0::/user.slice/xumd.service\n")
    assert linux.cgroup_delegated(proc, mount) == own
    proc.write_text("0::/\n")
    assert linux.cgroup_delegated(proc, mount) is None
    proc.write_text("4:memory:/x\n0::/user.slice/xumd.service\n")  # hybrid (v1 controllers)
    assert linux.cgroup_delegated(proc, mount) is None
    proc.write_text("0::/user.slice/xumd.service\n")
    (mount / "cgroup.controllers").unlink()  # not a cgroup v2 mount
    assert linux.cgroup_delegated(proc, mount) is None

    from xumd.daemon.containment_feature import _cgroup

    assert _cgroup("off") == (None, None)
    assert _cgroup(str(tmp_short / "not-a-cgroup")) == (
        None,
        "no cgroups on the portable platform backend"
        if PORTABLE
        else "not a cgroup v2 directory (no cgroup.procs)",
    )
    assert _cgroup("relative/path") == (None, "not an absolute path")
    read_only = tmp_short / "ro-cgroup"
    read_only.mkdir()
    (read_only / "cgroup.procs").write_text("")
    read_only.chmod(0o555)
    try:
        if not os.access(read_only, os.W_OK) and not PORTABLE:  # root may write anyway
            assert _cgroup(str(read_only)) == (None, "not writable by the daemon")
    finally:
        read_only.chmod(0o755)


def test_a_timed_out_command_takes_its_double_fork_with_it(tmp_short: Path) -> None:
    """The deadline path: the tree is killed on timeout, and the orphaned escapee by its marker."""
    pidfile = tmp_short / "escapee"
    cont = Containment(tag=root_tag(tmp_short))
    command = f"(setsid sh -c 'echo $$ > {pidfile}; exec sleep 100' &); exec sleep 100"
    result = run_async(
        lambda: run_command(
            ["/bin/sh", "-c", command],
            timeout_s=1.0,
            grace_s=0.5,
            containment=cont,
            marker=cont.marker("lease_t"),
        )
    )
    assert result.timed_out and result.escaped == []
    pid = int(until(lambda: pidfile.exists() and pidfile.read_text().strip()))
    assert not alive(identify(pid))


def test_leftovers_that_cannot_be_looked_for_fail_the_script(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors while looking in /proc (the fault: EMFILE from the environ read) is
    not "nothing left": the command's leftovers are reported unknown and the teardown fails;
    its retry, once /proc can be read again, succeeds."""
    checkout = tmp_short / "co"
    checkout.mkdir()
    runner = ScriptRunner(
        store=None,  # type: ignore[arg-type]
        root=tmp_short,
        timeout_s=10,
        grace_s=0.2,
        leases=None,
        containment=Containment(tag=root_tag(tmp_short)),
    )
    ref = WorkspaceRef("ws_1", "proj_1", "w", checkout, "inc")
    fail_process_read(monkeypatch, "environ", errno.EMFILE)
    try:
        outcome = run_async(
            lambda: runner._run_commands(
                "teardown", ["true"], "h", ref, checkout, None, dict(os.environ)
            )
        )
    finally:
        monkeypatch.undo()
    assert outcome.status == "failed"
    assert (
        outcome.error is not None and "cannot look in /proc: Too many open files" in outcome.error
    )
    again = run_async(
        lambda: runner._run_commands(
            "teardown", ["true"], "h", ref, checkout, None, dict(os.environ)
        )
    )
    assert again.status == "ok", again.error


def test_with_the_subreaper_orphans_that_cannot_be_read_still_fail_the_run(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the subreaper the /proc scan is skipped when no adopted orphan carries the run's
    marker; an orphan whose marker cannot be read (out of descriptors) may carry it, so the
    scan runs and, failing too, the run's leftovers are reported unknown, never "none"."""
    cont = Containment(tag=root_tag(tmp_short), subreaper=True)
    monkeypatch.setattr(containment, "foreign_children", lambda: {os.getpid()})
    fail_process_read(monkeypatch, "environ", errno.EMFILE)
    left = run_async(lambda: cont.leftovers(cont.marker("lease_o"), 0.1, always=False))
    monkeypatch.undo()
    assert [m.pid for m in left] == [0]
    assert "cannot look in /proc" in left[0].argv[0]


def test_a_process_that_cannot_be_pinned_is_not_reported_stopped(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cont = Containment(tag=root_tag(tmp_short))
    proc = _sleeper(str(Marker(cont.tag, "previousrun", "lease_p")))
    try:
        until(lambda: containment.read_marker(proc.pid) is not None)
        (found,) = containment.scan(cont.tag)

        def no_fd(pid: int, flags: int = 0) -> int:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

        # Linux: the kernel's pidfd_open; portable (no pidfds): the backend's pin itself.
        monkeypatch.setattr(BACKEND if PORTABLE else os, "pidfd_open", no_fd)
        left = run_async(lambda: containment.stop_marked([found], 0.2))
        monkeypatch.undo()
        assert [m.pid for m in left] == [proc.pid]
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_a_process_whose_state_cannot_be_read_is_not_taken_for_ended(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors when reading /proc/PID/stat (strict): the state is unknown, never
    "gone". A process that ignores SIGTERM is still SIGKILLed after the grace, not reported
    stopped while it runs on."""
    cont = Containment(tag=root_tag(tmp_short))
    env = dict(os.environ)
    env[containment.MARKER_VAR] = str(Marker(cont.tag, "previousrun", "lease_s"))
    proc = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 100"], env=env)
    real = linux.stat_fields
    pinned: list[int] = []

    def no_fd_when_strict(pid: int, *, strict: bool = False) -> list[str] | None:
        if strict and pinned:  # the first strict read is the pin's (its start time)
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        if strict:
            pinned.append(pid)
        return real(pid, strict=strict)

    real_status = psutil.Process.status

    def no_fd_after_the_pin(self: psutil.Process) -> str:
        # Portable: psutil's status is the state, and the pin's start read reads it first.
        if self.pid == proc.pid and pinned:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        if self.pid == proc.pid:
            pinned.append(self.pid)
        return str(real_status(self))

    try:
        until(lambda: containment.read_marker(proc.pid) is not None)
        # sh's own command line names sleep too: wait for the exec itself (TERM ignored by now).
        until(lambda: containment.argv_of(proc.pid)[:1] == ("sleep",))
        (found,) = containment.scan(cont.tag)
        if PORTABLE:
            monkeypatch.setattr(psutil.Process, "status", no_fd_after_the_pin)
        else:
            monkeypatch.setattr(linux, "stat_fields", no_fd_when_strict)
        pinned.append(proc.pid)
        assert containment._state(proc.pid) == "?"
        pinned.clear()
        left = run_async(lambda: containment.stop_marked([found], 0.2))
        monkeypatch.undo()
        if PORTABLE:
            # No pidfd to see its end through, and its state unreadable: it is reported left
            # (fail closed), never "stopped" on a guess.
            assert [m.pid for m in left] == [proc.pid]
        else:
            assert left == []
        proc.wait(timeout=5)  # SIGKILLed after the grace: gone, not merely said to be
    finally:
        proc.kill()
        proc.wait()


def test_a_marked_process_caught_mid_exec_is_still_found(tmp_short: Path) -> None:
    """Mid-exec the kernel shows no environment for a moment (the old program's is gone, the
    new one's is published after its argv), longer when the process is preempted there: a
    scan that caught a marked process then took it for unmarked, and a sweep missed it. Each
    round scans, without a pause, from the moment the marked shell runs until it has become
    `sleep`: every scan must find it. Without the wait for a user process's environment most
    rounds missed it at least once."""
    cont = Containment(tag=root_tag(tmp_short))
    env = dict(os.environ)
    env[containment.MARKER_VAR] = str(Marker(cont.tag, "previousrun", "lease_x"))
    for _ in range(20):
        proc = subprocess.Popen(["sh", "-c", "exec sleep 100"], env=env)
        try:
            # Polled without a pause (`until` sleeps between looks): the window is short.
            deadline = time.monotonic() + 10
            while containment.read_marker(proc.pid) is None:  # the forked copy is unmarked
                assert time.monotonic() < deadline, "the shell never started"
            while True:
                became_sleep = containment.argv_of(proc.pid)[:1] == ("sleep",)
                assert [m.pid for m in containment.scan(cont.tag)] == [proc.pid]
                if became_sleep:
                    break
                assert time.monotonic() < deadline, "sleep never started"
        finally:
            proc.kill()
            proc.wait()


def test_a_process_without_an_environment_is_not_marked(tmp_short: Path) -> None:
    """`env -i`: an empty environment that is no exec in progress (the process idles) is
    not waited for, and found unmarked."""
    cont = Containment(tag=root_tag(tmp_short))
    proc = subprocess.Popen(["env", "-i", "sleep", "100"])
    try:
        until(lambda: containment.argv_of(proc.pid)[:1] == ("sleep",))
        assert containment.read_marker(proc.pid) is None
        assert containment.scan(cont.tag) == []
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("unreadable", ["/environ", "/stat"])
def test_a_process_whose_identity_cannot_be_read_is_not_reported_stopped(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch, unreadable: str
) -> None:
    """Pinned but its marker (out of descriptors) or its start time (any failed read) cannot
    be read again: not taken for another process, which would be neither signalled nor
    reported. It is reported left, and the pidfd opened for it is closed."""
    cont = Containment(tag=root_tag(tmp_short))
    proc = _sleeper(str(Marker(cont.tag, "previousrun", "lease_u")))
    code = errno.EMFILE if unreadable == "/environ" else errno.EACCES
    try:
        until(lambda: containment.read_marker(proc.pid) is not None)
        (found,) = containment.scan(cont.tag)
        fds = len(os.listdir("/proc/self/fd"))
        fail_process_read(monkeypatch, unreadable[1:], code, pid=proc.pid)
        left = run_async(lambda: containment.stop_marked([found], 0.2))
        monkeypatch.undo()
        assert [m.pid for m in left] == [proc.pid]
        assert proc.poll() is None
        assert len(os.listdir("/proc/self/fd")) == fds  # no pidfd left open
    finally:
        proc.kill()
        proc.wait()


def test_a_cancellation_while_the_child_starts_still_kills_it() -> None:
    """A shutdown's cancellation can land as soon as the child exists. The start itself is
    synchronous now (`xumd.system.childproc.start`: no await between the fork and the handle, where
    `anyio.open_process` awaited its pipes); the cancellation lands at run_command's first
    await after it, which must still kill the tree. The fault: a cancel requested the moment
    the child was started (from `on_start`, which runs right after the start)."""
    started: list[ProcId] = []
    opened = anyio.Event()

    def on_start(pid: int) -> None:
        started.append(identify(pid))
        opened.set()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: run_command(
                    ["/bin/sh", "-c", "exec sleep 100"],
                    timeout_s=60,
                    grace_s=0.5,
                    on_start=on_start,
                )
            )
            await opened.wait()
            tg.cancel_scope.cancel()

    run_async(main)
    assert started
    assert not alive(started[0])


def test_a_program_that_cannot_run_is_named_through_the_cgroup_join_too(
    tmp_short: Path, cgroup_base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cgroup join script (the wrapper where setpriv is missing) exits 127/126 when its
    exec fails: the program is checked before it, so the answer is the CommandNotFound a bare
    exec gives, not a command that "exited with 127"."""
    from xumd.system import procutil
    from xumd.system.procutil import CommandNotFound

    monkeypatch.setattr(procutil, "_SETPRIV", None)  # the join script alone wraps the command
    cont = Containment(tag=root_tag(tmp_short), cgroup=cgroup_base)
    # The wrapper is there: a command that runs is in the run's own cgroup.
    where = anyio.run(
        lambda: run_command(["cat", "/proc/self/cgroup"], timeout_s=30, containment=cont)
    )
    assert where.ok and f"/xum-{cont.tag}/run-" in where.output.text(), where.output.text()
    for program in ("/nonexistent/xum-prog", "xum-no-such-program"):
        with pytest.raises(CommandNotFound, match=f"^{program}: command not found$"):
            anyio.run(lambda p=program: run_command([p], timeout_s=30, containment=cont))
    assert _runs(cgroup_base) == []


def test_a_command_through_the_cgroup_join_gets_every_signal_at_its_default(
    tmp_short: Path, cgroup_base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The join script is Python, which ignores SIGPIPE and SIGXFSZ at start-up; an ignored
    signal survives its exec. A setup script or git run through it must start with nothing
    ignored and nothing blocked (`seq 1e9 | head -1` in a setup ends)."""
    from xumd.system import procutil

    monkeypatch.setattr(procutil, "_SETPRIV", None)  # the join script alone wraps the command
    cont = Containment(tag=root_tag(tmp_short), cgroup=cgroup_base)
    argv = ["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"]
    seen = anyio.run(lambda: run_command(argv, timeout_s=30, containment=cont))
    assert seen.ok, seen.output.text()
    assert changed_signals(seen.output.text()) == {"SigIgn": set(), "SigBlk": set()}


# -- the fallback when a cgroup cannot be used ---------------------------------------------------


def test_an_unusable_configured_cgroup_is_shown_degraded_and_runs_are_still_contained(
    root: Path, tmp_short: Path, reap_strays: list[int]
) -> None:
    """A configured cgroup that is not one (a plain directory: no cgroup.procs) is refused at
    start: daemon.status and `xum status` say containment is degraded and why; a teardown's
    double fork is still stopped by its marker before the remove says completed."""
    from xum_client.cli import _status_lines

    not_a_cgroup = tmp_short / "not-a-cgroup"
    not_a_cgroup.mkdir()
    repo = make_repo(tmp_short / "repo")
    ctl = tmp_short / "ctl"
    ctl.mkdir()
    teardown = (
        f"setsid sh -c 'echo $$ > {ctl}/escapee; exec sleep 100' & "
        f"until [ -s {ctl}/escapee ]; do sleep 0.01; done"
    )
    with_scripts(repo, teardown=[teardown])
    write_config(root, f'[processes]\ncgroup = "{not_a_cgroup}"\n')
    daemon = DaemonProcess(root).start()
    try:
        status = daemon.call("daemon.status")
        details = status["details"]["containment"]
        assert details["cgroup"] is None and details["cgroup_setting"] == str(not_a_cgroup)
        assert details["mechanism"] == NO_CGROUP
        assert "cannot be used" in details["degraded"], details
        assert UNUSABLE_DIR in details["degraded"], details
        assert "degraded: the configured cgroup" in dict(_status_lines(status))["containment"]
        project = trusted(daemon, repo)
        ws = create(daemon, project["id"], "fallback")["workspace"]
        result = daemon.call("workspace.remove", {"workspace_id": ws["id"]})
        escapee = identify(int((ctl / "escapee").read_text()))
        reap_strays.append(escapee.pid)
        assert result["cleanup"]["status"] == "completed", result["cleanup"]
        assert not alive(escapee), "the fallback did not stop the double-forked teardown child"
        assert marked(root) == []
    finally:
        daemon.close()


def test_the_default_auto_without_delegation_is_not_degraded(daemon: DaemonProcess) -> None:
    # `auto` means "where one is delegated": none here is the expected case, not a fault.
    details = daemon.call("daemon.status")["details"]["containment"]
    assert details["cgroup_setting"] == "auto" and details["cgroup"] is None
    assert details["degraded"] is None and details["runs_without_cgroup"] == 0


def test_runs_that_lose_their_cgroup_are_counted_and_shown_degraded(
    root: Path, tmp_short: Path, cgroup_base: Path
) -> None:
    """The configured cgroup disappears while the daemon runs: every run goes ahead without
    its cgroup (refusing them would stop the daemon altogether), and daemon.status stops
    claiming what it no longer has: `degraded` says so and counts them."""
    repo = make_repo(tmp_short / "repo")
    write_config(root, f'[processes]\ncgroup = "{cgroup_base}"\n')
    daemon = DaemonProcess(root).start()
    try:
        before = daemon.call("daemon.status")["details"]["containment"]
        if PORTABLE:
            # No cgroup was ever used: none to lose, nothing counted; still said degraded.
            _without_cgroups(daemon, before)
            create(daemon, add_project(daemon, repo)["id"], "lost")
            after = daemon.call("daemon.status")["details"]["containment"]
            assert after["runs_without_cgroup"] == 0 and after["degraded"] == before["degraded"]
            return
        assert before["cgroup"] == str(cgroup_base) and before["degraded"] is None
        for sub in sorted(cgroup_base.rglob("*"), reverse=True):
            if sub.is_dir():
                sub.rmdir()
        cgroup_base.rmdir()  # empty: nothing runs yet
        project = add_project(daemon, repo)
        create(daemon, project["id"], "lost")
        after = daemon.call("daemon.status")["details"]["containment"]
        assert after["runs_without_cgroup"] >= 1, after
        assert "started without their own cgroup" in after["degraded"], after
        assert str(cgroup_base) in after["degraded"]
    finally:
        daemon.close()
