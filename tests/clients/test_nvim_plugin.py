"""The Neovim plugin (clients/nvim) against a real xumd: headless Neovim runs each scenario of
tests/nvim/scenarios.lua, driving the :Xum commands, the statusline, events and
:checkhealth, with the real `xum` CLI as a second client. Skips when `nvim` is absent (CI
installs it: .ci/run)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import xumd
from xum_client import Client
from xum_client.errors import VersionMismatch
from xum_client.sync import LOCAL_HINT
from xum_protocol.discovery import resolve_socket

from tests.support import manyrows
from tests.support.cutproxy import CuttingProxy
from tests.support.daemon import DaemonProcess, short_tmpdir, write_config
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import add_project, commit_scripts, failing_teardown

# XUM_TEST_NVIM: another Neovim to run the scenarios with (the oldest and newest supported).
NVIM = os.environ.get("XUM_TEST_NVIM") or shutil.which("nvim")
pytestmark = pytest.mark.skipif(
    NVIM is None, reason="nvim is not installed (apt-get install neovim)"
)

REPO_ROOT = Path(__file__).resolve().parents[2]
PLUGIN = REPO_ROOT / "clients" / "nvim"
HARNESS = Path(__file__).parents[1] / "nvim" / "harness.lua"
SCENARIOS = Path(__file__).parents[1] / "nvim" / "scenarios.lua"
XUM = str(Path(sys.executable).parent / "xum")
# Each headless run is bounded: a scenario that hangs fails here, with its output, before
# pytest-timeout (120 s per test) would end it without.
RUN_TIMEOUT = 100.0

_names = itertools.count()


def headless_nvim(*commands: str) -> list[str]:
    """Neovim with nothing but the plugin under test (no user config, shada or swap files),
    running `commands` (each an ex command) in order."""
    assert NVIM is not None
    argv = [NVIM, "--headless", "-u", "NONE", "-i", "NONE", "-n", "--cmd", f"set rtp^={PLUGIN}"]
    for command in commands:
        argv += ["-c", command]
    return argv


class World:
    def __init__(
        self,
        base: Path,
        *,
        teardown: str | None = None,
        setup: list[str] | None = None,
        config: str = "",
        populate: int = 0,
    ) -> None:
        self.base = base
        self.root = base / "root"
        if populate:
            manyrows.populate(self.root, populate)
        if config:
            write_config(self.root, config)
        self.daemon = DaemonProcess(self.root).start()
        try:
            self.repo = make_repo(base / "repo")
            if teardown or setup:
                commit_scripts(self.repo, teardown=teardown or "true", setup=setup)
            self.project = add_project(self.daemon, self.repo)
            if teardown or setup:
                self.daemon.call("project.trust", {"project_id": self.project["id"]})
            # a second project, so that names can be ambiguous and `new` can have to ask
            self.other = add_project(self.daemon, make_repo(base / "other"))
        except BaseException:
            self.daemon.close()
            raise

    def close(self) -> None:
        self.daemon.close()


@contextmanager
def world_in(base: Path, **options: Any) -> Iterator[World]:
    """A World in `base` (made by short_tmpdir), closed and removed after."""
    try:
        world = World(base, **options)
        try:
            yield world
        finally:
            world.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def shared() -> Iterator[World]:
    """One daemon for the scenarios that leave it running (each uses its own names)."""
    with world_in(short_tmpdir("xumnv-")) as world:
        yield world


@pytest.fixture
def own() -> Iterator[World]:
    """A daemon of the test's own, for the scenarios that restart or stop it."""
    with world_in(short_tmpdir("xumnv-")) as world:
        yield world


def run_scenario(
    world: World,
    scenario: str,
    *,
    env: dict[str, str] | None = None,
    driver: dict[str, Any] | None = None,
) -> str:
    """Run one scenario in a headless Neovim; return its stderr (the plugin's notifications).

    `driver` maps a request name the scenario may make (T.ask_driver) to a function the test
    runs when it is asked, before it answers `done`."""
    signals = short_tmpdir("xumsig-")
    name = f"nv{next(_names)}-{os.getpid() % 10000}"
    full_env = {
        **os.environ,
        "XUM_ROOT": str(world.root),
        "XUM_SOCKET": str(world.daemon.socket_path),
        "XUM_CLI": XUM,
        "XUM_TEST_REPO": str(world.repo),
        "XUM_TEST_PROJECT": world.project["name"],
        "XUM_TEST_OTHER": world.other["name"],
        "XUM_TEST_NAME": name,
        "XUM_TEST_SIGNALS": str(signals),
        "XUM_TEST_RESUME": "1",  # the daemon replays after `after_seq` (protocol 1.1)
        "XUM_NVIM_SCENARIO": scenario,
        "XUM_NVIM_SCENARIOS": str(SCENARIOS),
        # no user configuration, no shada, no swap files: only the plugin under test
        "XDG_CONFIG_HOME": str(signals / "config"),
        "XDG_DATA_HOME": str(signals / "data"),
        "XDG_STATE_HOME": str(signals / "state"),
        **(env or {}),
    }
    full_env = {k: v for k, v in full_env.items() if v != "<unset>"}
    proc = subprocess.Popen(
        headless_nvim("runtime plugin/xum.lua", f"luafile {HARNESS}"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=world.base,
        env=full_env,
    )
    errors: list[str] = []
    stderr_lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            stderr_lines.append(raw.decode(errors="replace"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + RUN_TIMEOUT
    try:
        handled: set[str] = set()
        while proc.poll() is None:
            for request, action in (driver or {}).items():
                if request not in handled and (signals / f"{request}.request").exists():
                    handled.add(request)
                    try:
                        action()
                    except Exception as exc:  # the scenario waits on `done`: say why not
                        errors.append(f"{request}: {exc!r}")
                        raise
                    (signals / f"{request}.done").write_text("1")
            try:
                proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait(10)
                pytest.fail(
                    f"nvim scenario {scenario} ran over {RUN_TIMEOUT}s:\n{''.join(stderr_lines)}"
                )
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(signals, ignore_errors=True)
    output = "".join(stderr_lines)
    assert not errors, errors
    assert proc.returncode == 0, f"nvim scenario {scenario} failed:\n{output}"
    assert f"PASSED {scenario}" in output, output
    return output


def workspaces_all(world: World) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = world.daemon.call("workspace.list", {})["workspaces"]
    return listed


def workspaces(world: World) -> dict[str, dict[str, Any]]:
    listed = world.daemon.call("workspace.list", {})["workspaces"]
    return {ws["name"]: ws for ws in listed}


def test_connect_hello_and_requests_by_id(shared: World) -> None:
    run_scenario(shared, "connect")


def test_discovery_rule_and_unreachable_socket(shared: World) -> None:
    # no XUM_SOCKET: the scenario reaches the daemon through $XUM_ROOT alone
    run_scenario(shared, "discovery", env={"XUM_SOCKET": "<unset>"})


def test_discovery_matches_the_python_rule(shared: World, tmp_path: Path) -> None:
    """One rule everywhere: the plugin picks the socket xum_protocol.discovery picks, for every
    combination of its settings and the environment (empty values included)."""
    cases = []
    for sock, root, xs, xr, xdg in itertools.product(
        (None, "", "/o/s.sock", "~/o.sock"),
        (None, "", "/or", "~"),
        (None, "", "/s.sock", "~/s.sock", "~x/s.sock"),
        (None, "", "/r", "~/r"),
        (None, "/st", "~/st"),
    ):
        env = {"HOME": "/h"}
        for key, value in (("XUM_SOCKET", xs), ("XUM_ROOT", xr), ("XDG_STATE_HOME", xdg)):
            if value is not None:
                env[key] = value
        want = resolve_socket(sock, root, env)
        opts = {k: v for k, v in (("socket", sock), ("root", root)) if v is not None}
        cases.append({"opts": opts, "env": env, "want": str(want.path)})
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    run_scenario(shared, "discovery_matrix", env={"XUM_TEST_CASES": str(path)})


def test_event_cache_order_removals_obligations(shared: World) -> None:
    run_scenario(shared, "state")


def test_json_null_is_handled(shared: World) -> None:
    run_scenario(shared, "nulls")


def test_only_mutating_calls_carry_a_request_key(shared: World) -> None:
    run_scenario(shared, "request_keys")


def test_commands_new_open_archive_unarchive_rm(shared: World) -> None:
    before = set(workspaces(shared))
    output = run_scenario(shared, "lifecycle")
    # the daemon agrees: the workspace the scenario made is gone again
    assert set(workspaces(shared)) == before, output


def test_command_refusals(shared: World) -> None:
    run_scenario(shared, "refusals")


def test_completion_of_workspace_names(shared: World) -> None:
    run_scenario(shared, "complete")


def test_names_in_two_projects_and_project_picker(shared: World) -> None:
    run_scenario(shared, "ambiguous")
    names = {(ws["project_id"], ws["name"], ws["state"]) for ws in workspaces_all(shared)}
    assert any(p == shared.project["id"] and st == "archived" for p, _, st in names), names


def test_busy_error_names_holders_and_terminal_lease(shared: World) -> None:
    output = run_scenario(shared, "busy")
    archived = [ws for ws in workspaces(shared).values() if ws["state"] == "archived"]
    assert archived, output


def test_live_updates_from_events(shared: World) -> None:
    run_scenario(shared, "events")


def kill_and_start(daemon: DaemonProcess) -> None:
    daemon.kill()  # SIGKILL: no goodbye on the socket
    daemon.start()


def test_reconnect_after_daemon_restart(own: World) -> None:
    run_scenario(
        own,
        "reconnect",
        driver={"restart": lambda: kill_and_start(own.daemon), "stop": own.daemon.terminate},
    )


def test_resume_after_dropped_connection(shared: World) -> None:
    run_scenario(shared, "resume")


def test_checkhealth(shared: World) -> None:
    # a socket file nobody listens on, as a SIGKILLed daemon leaves it
    stale = shared.base / "stale.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(stale))
    run_scenario(shared, "health", env={"XUM_TEST_STALE": str(stale)})


def test_helptags_are_valid(tmp_path: Path) -> None:
    doc = tmp_path / "doc"
    shutil.copytree(PLUGIN / "doc", doc)
    assert NVIM is not None
    done = subprocess.run(
        [NVIM, "--headless", "-u", "NONE", "-i", "NONE", "-c", f"helptags {doc}", "-c", "qall!"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "E154" not in done.stderr and "E670" not in done.stderr, done.stderr
    tags = (doc / "tags").read_text()
    for tag in ("xum.txt", ":Xum", "xum-statusline", "xum-health", "xum.setup()"):
        assert f"{tag}\t" in tags, tags


def test_installed_like_a_plugin_manager_does(tmp_path: Path) -> None:
    """The directory on 'runtimepath' with plugins loading as usual (--clean: no user config):
    :Xum exists, :help finds the plugin's tags, and nothing connects before it is used."""
    plugin = tmp_path / "xum.nvim"
    shutil.copytree(PLUGIN, plugin)
    assert NVIM is not None
    probe = (
        "lua io.stderr:write('cmd=' .. vim.fn.exists(':Xum') .. ' status=' .. "
        "require('xum.client').status .. '\\n')"
    )
    done = subprocess.run(
        [
            NVIM,
            "--headless",
            "--clean",
            "--cmd",
            f"set rtp^={plugin}",
            "-c",
            f"helptags {plugin / 'doc'}",
            "-c",
            "help xum-statusline",
            "-c",
            "lua io.stderr:write('help=' .. vim.bo.filetype .. ':' .. vim.fn.expand('%:t') "
            ".. '\\n')",
            "-c",
            probe,
            "-c",
            "qall!",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "XUM_SOCKET": str(tmp_path / "none.sock")},
    )
    assert done.returncode == 0, done.stderr
    assert "help=help:xum.txt" in done.stderr, done.stderr
    assert "cmd=2 status=idle" in done.stderr, done.stderr


def test_bad_peers_time_out_or_disconnect(shared: World) -> None:
    run_scenario(shared, "bad_peers")


def test_resume_answered_by_another_run_is_a_resync(shared: World) -> None:
    """A peer that answers a resume with another epoch but no `resync_required`: the plugin
    still replaces what it knew (xumd itself sets the flag; the check is the plugin's own)."""
    run_scenario(shared, "epoch_change")


def test_protocol_mismatch_is_shown_and_not_retried(shared: World) -> None:
    run_scenario(shared, "mismatch")


def test_the_plugins_release_is_the_distributions() -> None:
    text = (PLUGIN / "lua" / "xum" / "client.lua").read_text()
    assert f"VERSION = '{xumd.__version__}'," in text


def test_release_mismatch_is_the_python_clients_and_not_retried(shared: World) -> None:
    with Client(shared.root, check_version=False) as client:
        assert client.server is not None
        theirs, root = client.server["server"]["version"], client.server["root"]
    expected = VersionMismatch("0.99.0", theirs, f"on {root}", LOCAL_HINT)
    run_scenario(
        shared,
        "release",
        env={
            "XUM_TEST_MISMATCH": str(expected),
            "XUM_TEST_XUMD_VERSION": theirs,
            "XUM_TEST_DAEMON_PID": str(shared.daemon.pid),
        },
    )


def test_daemon_killed_during_archive(own: World) -> None:
    """SIGKILL (a fault point) mid-archive: the command fails `disconnected` at once; after the
    restart the plugin shows what recovery left."""
    daemon = own.daemon
    daemon.env = {"XUM_FAULT": "workspace.archive.after_intent"}
    daemon.restart()

    def restart() -> None:
        assert daemon.proc is not None
        daemon.proc.wait(30)
        assert daemon.proc.returncode == -9, daemon.log_text()[-2000:]
        daemon.env = {}
        daemon.start()

    run_scenario(own, "crash", driver={"restart": restart})


def test_statusline_shows_pending_cleanup() -> None:
    """A teardown that fails keeps the archive's cleanup pending: the archive says so, the
    statusline counts it, and it clears by events once the teardown passes."""
    base = short_tmpdir("xumnv-")
    ctl = base / "ctl"
    ctl.mkdir()
    with world_in(
        base,
        teardown=failing_teardown(ctl),
        config="[cleanup]\nbackoff_initial_s = 0.2\nbackoff_max_s = 0.5\n",
    ) as world:
        run_scenario(world, "cleanup", env={"XUM_TEST_CTL": str(ctl)})


def test_resume_past_the_ring_resyncs() -> None:
    """The same daemon run, but the replay ring no longer holds what was missed (size 0):
    `resync_required`, and the snapshot replaces what the plugin knew."""
    with world_in(short_tmpdir("xumnv-"), config="event_ring_size = 0\n") as world:
        run_scenario(world, "resume", env={"XUM_TEST_RESUME": "0"})


HOSTILE_NAME = b"\x1b[31mevil\nname"
"""A process name with an escape sequence and a newline (a process picks its own name)."""


def test_holder_with_hostile_name_is_shown_escaped(shared: World) -> None:
    """A process that renamed itself with control characters holds a checkout: the busy
    error names it with those characters escaped, never raw on the screen."""
    created = shared.daemon.call(
        "workspace.create", {"project_id": shared.project["id"], "name": "nv-hostile"}
    )
    path = created["workspace"]["path"]
    script = (
        "import ctypes, sys, time\n"
        "ctypes.CDLL(None).prctl(15, ctypes.c_char_p(sys.argv[1].encode('latin-1')), 0, 0, 0)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, HOSTILE_NAME.decode("latin-1")],
        cwd=path,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"ready\n"
        comm = Path(f"/proc/{holder.pid}/comm").read_bytes()
        assert comm.startswith(b"\x1b[31mevil"), comm
        output = run_scenario(shared, "hostile_label", env={"XUM_TEST_HOLDER": str(holder.pid)})
        assert "\x1b" not in output, output
    finally:
        holder.kill()
        holder.wait(10)


def test_setup_progress_shown_while_waiting() -> None:
    """A create or unarchive made from Neovim shows each setup command as it starts (from
    `script.started` events), before the answer."""
    with world_in(short_tmpdir("xumnv-"), setup=["echo first step", "echo second step"]) as world:
        run_scenario(world, "setup_progress")


def test_failed_setup_is_a_warning_on_create_and_unarchive() -> None:
    """A setup that fails is shown as a warning, after a create and after an
    unarchive alike."""
    with world_in(short_tmpdir("xumnv-"), setup=["echo about to fail", "exit 3"]) as world:
        run_scenario(world, "setup_fails")


def test_a_root_larger_than_a_page_is_loaded_in_pages() -> None:
    """1,203 workspaces on record: the snapshot and listings come in pages of 500 under a frame
    cap that the whole listing would pass, and a workspace created between two pages is there
    once (tests/nvim/scenarios.lua, S.bigroot)."""
    with world_in(short_tmpdir("xumnv-"), populate=1203) as world:
        listed = world.daemon.call("workspace.list", {})
        count = len(listed["workspaces"])
        assert count == 1203
        cap = int(len(json.dumps(listed)) * 0.6)
        run_scenario(world, "bigroot", env={"XUM_TEST_COUNT": str(count), "XUM_TEST_CAP": str(cap)})


def test_a_request_cut_by_a_killed_daemon_says_whether_it_was_sent() -> None:
    """SIGKILL during a request the daemon read: `sent`, outcome unknown; SIGKILL of a daemon
    that had stopped reading (SIGSTOP) with requests queued: never sent; the plugin closing
    behind a stopped daemon: the request cut part-way is not called unsent (S.lost)."""
    with world_in(short_tmpdir("xumnv-"), config="enable_test_methods = true\n") as world:
        daemon = world.daemon

        def stop() -> None:
            os.kill(daemon.pid, signal.SIGSTOP)

        def cont() -> None:
            os.kill(daemon.pid, signal.SIGCONT)

        run_scenario(
            world,
            "lost",
            driver={
                "kill1": daemon.kill,
                "start2": daemon.start,
                "stop2": stop,
                "kill2": daemon.kill,
                "start3": daemon.start,
                "stop3": stop,
                "cont3": cont,
            },
        )


@pytest.mark.parametrize("retry", [True, False], ids=["retried", "retry_lost_off"])
def test_a_cut_mutating_call_is_sent_again_with_its_request_key(shared: World, retry: bool) -> None:
    """The plugin keys its mutating calls (clients/nvim/lua/xum/methods.lua, written from the
    protocol's table): a create whose answer a real proxy cut after forwarding it is sent once
    more with the same key and answered the first call's outcome, so exactly one workspace
    exists; with `retry_lost = false` the call fails `disconnected` with `sent`."""
    where = short_tmpdir("xumcut-")
    try:
        with CuttingProxy(
            where / "p.sock", shared.daemon.socket_path, b"workspace.create"
        ) as proxy:
            output = run_scenario(
                shared,
                "keyed",
                env={"XUM_SOCKET": str(proxy.listen), "XUM_TEST_RETRY": "1" if retry else "0"},
            )
            assert proxy.cut.is_set()
        (made,) = [line.split()[1:] for line in output.splitlines() if line.startswith("MADE ")]
        ident, name = made
        named = [ws["id"] for ws in workspaces_all(shared) if ws["name"] == name]
        if retry:
            assert named == [ident]  # once: the repeat was answered the first call's outcome
        else:
            assert len(named) <= 1  # the daemon finished it or took it back, on its own
    finally:
        shutil.rmtree(where, ignore_errors=True)
