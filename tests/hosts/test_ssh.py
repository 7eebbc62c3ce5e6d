"""Hosts through a real OpenSSH server on loopback (tests/support/sshd.py, docs/HOSTS.md):
the CLI's `--host` / `XUM_HOST`, `Client(host=)` and `AsyncClient(host=)`, the bridge starting
the host's daemon, a connection dropped mid-archive, and a host that is down, refuses the key,
or has no xum."""

from __future__ import annotations

import errno
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from xum_client import AsyncClient, Client, ClientTimeout, ConnectionLost
from xum_client.errors import BridgeFailed, HostKeyRefused, HostUnreachable, XumMissingOnHost
from xum_client.hosts import HostEntry, add_host

from tests.support.daemon import short_tmpdir
from tests.support.gitrepo import make_repo
from tests.support.lifecycle_helpers import commit_scripts
from tests.support.lockholder import read_holder
from tests.support.procs import alive, identify
from tests.support.sshd import ALIAS, ALIAS_BADKEY, ALIAS_DOWN, SshServer, stop_root_daemon
from tests.support.terminal import run_on_a_terminal
from tests.support.wait import until

XUM = str(Path(sys.executable).parent / "xum")


@pytest.fixture(scope="module")
def sshd() -> Iterator[SshServer]:
    base = short_tmpdir("xsd-")
    server = SshServer(base).start()
    yield server
    server.close()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def host_env(
    sshd: SshServer, tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """Host `h1` (this sshd, a remote root under the test's temp directory), in a hosts file of
    the test's own; the same variables for in-process clients and the CLI."""
    env = {**sshd.env(), "XUM_HOSTS_FILE": str(tmp_short / "hosts.toml")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("XUM_HOST", raising=False)
    remote_root = tmp_short / "remote-root"
    add_host(HostEntry("h1", ALIAS, str(remote_root)))
    env["REMOTE_ROOT"] = str(remote_root)
    yield env
    stop_root_daemon(remote_root)


def xum(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [XUM, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **env},
    )


def xum_json(env: dict[str, str], *args: str) -> dict[str, Any]:
    done = xum(env, "--json", *args)
    assert done.returncode == 0, (done.stdout, done.stderr)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_cli_through_a_host(host_env: dict[str, str], tmp_short: Path) -> None:
    remote_root = Path(host_env["REMOTE_ROOT"])
    assert read_holder(remote_root / "xumd.lock") is None
    repo = make_repo(tmp_short / "repo")

    checked = xum_json(host_env, "host", "check", "h1")
    # The bridge started the host's daemon on the entry's remote root.
    holder = read_holder(remote_root / "xumd.lock")
    assert holder is not None
    assert checked["pid"] == holder["pid"]
    assert checked["root"] == str(remote_root)
    assert checked["version"] and checked["protocol"]

    # The path is the host's: not checked here (a path missing there is the host's answer).
    missing = xum(host_env, "--host", "h1", "--json", "project", "add", "/nonexistent/xum-repo")
    assert missing.returncode not in (0, 2), missing.stdout
    assert json.loads(missing.stdout)["error"]["code"] is not None  # the daemon's error
    added = xum_json(host_env, "--host", "h1", "project", "add", str(repo))
    assert added["project"]["name"] == "repo"
    created = xum_json(host_env, "--host", "h1", "ws", "new", "repo", "one")
    ws = created["workspace"]
    assert ws["path"].startswith(str(remote_root))
    # XUM_HOST is the same as --host (`status` off a terminal too: the fast entry defers)
    listed = xum_json({**host_env, "XUM_HOST": "h1"}, "ws", "ls")
    assert [w["name"] for w in listed["workspaces"]] == ["one"]
    assert xum_json({**host_env, "XUM_HOST": "h1"}, "status")["root"] == str(remote_root)
    shown = xum_json(host_env, "--host", "h1", "ws", "show", "repo/one")
    assert shown["workspace"]["id"] == ws["id"]
    archived = xum_json(host_env, "--host", "h1", "ws", "archive", "repo/one")
    assert archived["workspace"]["state"] == "archived"
    assert archived["cleanup"]["status"] == "completed"
    assert not Path(ws["path"]).exists()
    # The same daemon answered every time, and the human form of `host check` says so.
    human = xum(host_env, "host", "check", "h1").stdout
    assert f"h1 ({ALIAS}): xumd " in human
    assert f"root {remote_root}, pid {holder['pid']}" in human


def test_host_root_flag_overrides_the_entry(host_env: dict[str, str], tmp_short: Path) -> None:
    other = tmp_short / "other-root"
    try:
        status = xum_json(host_env, "--host", "h1", "--root", str(other), "status")
        assert status["root"] == str(other)
        # `daemon stop` through a host asks that daemon to stop (its lock is the host's).
        stopped = xum_json(host_env, "--host", "h1", "--root", str(other), "daemon", "stop")
        assert stopped == {
            "stopped": False,
            "stopping": True,
            "pid": status["pid"],
            "root": str(other),
            "host": "h1",
        }
        until(lambda: read_holder(other / "xumd.lock") is None, 60, message="that daemon's exit")
    finally:
        stop_root_daemon(other)


def test_python_clients_through_a_host(host_env: dict[str, str]) -> None:
    remote_root = host_env["REMOTE_ROOT"]
    with Client(host="h1") as client:
        assert client.root == remote_root
        assert client.call("daemon.status")["root"] == remote_root
        ssh_pid = client.ssh_pid
        assert ssh_pid is not None
        ssh = identify(ssh_pid)
        assert alive(ssh)
    # Closing the client ends (and reaps) its ssh.
    assert not alive(ssh)
    with pytest.raises(psutil.NoSuchProcess):
        psutil.Process(ssh_pid).status()

    async def run_async() -> int:
        async with AsyncClient(host="h1") as aclient:
            status = await aclient.status()
            assert status.root == remote_root
            assert aclient.server is not None and aclient.server.root == remote_root
            assert aclient.ssh_pid is not None
            return aclient.ssh_pid

    async_ssh = anyio.run(run_async)
    with pytest.raises(psutil.NoSuchProcess):
        psutil.Process(async_ssh).status()


# -- a host that cannot be used: one clear line each --------------------------------------------


@pytest.fixture
def no_xum_sshd(sshd: SshServer) -> Iterator[SshServer]:
    """A second server whose sessions' PATH has no xum (and no data-directory venv, and a
    HOME of its own: no ~/.local/bin/xum either)."""
    base = short_tmpdir("xsn-")
    (base / "home").mkdir()
    server = SshServer(
        base, path_head=[], authorized_from=sshd, set_env={"HOME": str(base / "home")}
    )
    server.start()
    yield server
    server.close()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def noisy_sshd(sshd: SshServer) -> Iterator[SshServer]:
    """A server whose sessions print a banner on stdout before running the command (what a
    chatty shell startup file does for non-interactive shells)."""
    base = short_tmpdir("xsq-")
    force = """ForceCommand echo 'Welcome to the build farm!'; eval "$SSH_ORIGINAL_COMMAND"\n"""
    server = SshServer(base, authorized_from=sshd, extra_config=force)
    server.start()
    yield server
    server.close()
    shutil.rmtree(base, ignore_errors=True)


def test_unusable_hosts_each_say_why(
    host_env: dict[str, str], no_xum_sshd: SshServer, noisy_sshd: SshServer, tmp_short: Path
) -> None:
    add_host(HostEntry("down", ALIAS_DOWN))
    add_host(HostEntry("badkey", ALIAS_BADKEY))
    # The alias's key and known hosts, another server's port: an ssh option in the entry.
    add_host(HostEntry("noxum", ALIAS, None, {"Port": str(no_xum_sshd.port)}))
    add_host(HostEntry("noisy", ALIAS, None, {"Port": str(noisy_sshd.port)}))
    (tmp_short / "empty_known_hosts").write_text("")
    strict = {
        "StrictHostKeyChecking": "yes",
        "UserKnownHostsFile": str(tmp_short / "empty_known_hosts"),
    }
    add_host(HostEntry("unknownkey", ALIAS, None, strict))
    # A remote root the bridge cannot make (under a file): the bridge's own line comes back.
    (tmp_short / "a-file").write_text("")
    add_host(HostEntry("badroot", ALIAS, str(tmp_short / "a-file" / "root")))
    expected = {
        "down": ("host_unreachable", "is unreachable: ssh: connect to host 127.0.0.1 port"),
        "badkey": ("host_key_refused", "refused the key: "),
        "unknownkey": ("host_key_unverified", "ssh could not verify the host's key"),
        "noxum": ("xum_missing", "xum is not installed on host 'noxum'"),
        "noisy": ("bridge_failed", "wrote 'Welcome to the build farm!' before xum's bridge ran"),
        "badroot": ("bridge_failed", "(ssh exit 1): xum bridge: cannot prepare root "),
    }
    for name, (kind, text) in expected.items():
        as_json = xum(host_env, "--host", name, "--json", "ws", "ls")
        assert as_json.returncode == 6, (name, as_json.stdout, as_json.stderr)
        error = json.loads(as_json.stdout)["error"]
        assert error["kind"] == kind, error
        assert text in error["message"], error
        assert "\n" not in error["message"]
        assert error["data"]["host"] == name
        # Without --json: `xum: KIND: MESSAGE`, the same kind and message (README, "Errors").
        human = xum(host_env, "--host", name, "ws", "ls")
        assert human.returncode == 6, (name, human.stderr)
        assert human.stderr == f"xum: {kind}: {error['message']}\n"
    # Without --json: the same message, one line on stderr, nothing on stdout.
    done = xum(host_env, "--host", "badkey", "ws", "ls")
    assert done.returncode == 6
    assert done.stdout == ""
    assert done.stderr.startswith(
        "xum: host_key_refused: host 'badkey' (xumtest1-badkey) refused the key: "
    )
    assert done.stderr.count("\n") == 1, done.stderr
    # The Python client raises the typed errors.
    for name, cls in (("down", HostUnreachable), ("badkey", HostKeyRefused)):
        with pytest.raises(cls):
            Client(host=name)
    with pytest.raises(XumMissingOnHost, match="xum host install noxum"):
        Client(host="noxum")

    async def noisy() -> None:
        async with AsyncClient(host="noisy"):
            pass

    with pytest.raises(BridgeFailed, match="Welcome to the build farm"):
        anyio.run(noisy)


# -- a connection dropped mid-call --------------------------------------------------------------


@pytest.fixture
def slow_ws(host_env: dict[str, str], tmp_short: Path) -> Iterator[tuple[dict[str, Any], Path]]:
    """`_slow_teardown_workspace`; a teardown still waiting when the test ends (it failed
    half-way) is let go before the host's daemon is stopped."""
    ws, ctl = _slow_teardown_workspace(tmp_short)
    yield ws, ctl
    try:
        fd = os.open(ctl / "fifo", os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return  # no reader: nothing waits
    try:
        os.write(fd, b"go\n")
    finally:
        os.close(fd)


def _slow_teardown_workspace(tmp_short: Path) -> tuple[dict[str, Any], Path]:
    """A workspace on host h1 of a trusted project whose teardown says it started, then waits
    on a FIFO the test writes to (`release`): an archive in flight for as long as the test
    wants. Set up through one client (one ssh connection)."""
    ctl = tmp_short / "ctl"
    ctl.mkdir()
    os.mkfifo(ctl / "fifo")
    repo = make_repo(tmp_short / "repo")
    commit_scripts(repo, teardown=f"touch {ctl}/started && read line < {ctl}/fifo")
    with Client(host="h1") as client:
        project = client.call("project.add", {"path": str(repo)})["project"]
        client.call("project.trust", {"project_id": project["id"]})
        ws = client.call("workspace.create", {"project_id": project["id"], "name": "one"})
    return ws["workspace"], ctl


def release(ctl: Path) -> None:
    """Let the teardown go on: write a line to its FIFO once it reads it."""

    def open_writer() -> int | None:
        try:
            return os.open(ctl / "fifo", os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no reader yet
                return None
            raise

    fd = until(open_writer, message="the teardown reading its FIFO")
    try:
        os.write(fd, b"go\n")
    finally:
        os.close(fd)


def wait_archived(remote_root: Path, workspace_id: str) -> None:
    """Until the host's daemon has archived the workspace: asked on its socket directly (the
    host is this machine), so the wait costs no ssh connection per look."""

    def archived() -> bool:
        with Client(remote_root) as client:
            row = client.call("workspace.get", {"workspace_id": workspace_id})["workspace"]
        return bool(row["state"] == "archived")

    until(archived, 60, message="the host's daemon to finish the archive")


def _ssh_child(cli: subprocess.Popen[str]) -> psutil.Process:
    def find() -> psutil.Process | None:
        for child in psutil.Process(cli.pid).children(recursive=True):
            if child.name() == "ssh":
                return child
        return None

    found = until(find, message="the CLI's ssh process")
    return found


def test_connection_dropped_mid_archive_is_retried_with_its_key(
    host_env: dict[str, str], slow_ws: tuple[dict[str, Any], Path]
) -> None:
    """ssh killed while the host archives: the CLI opens a new link and sends the archive again
    with its request key; the host's daemon answers it with the first archive's outcome (it
    waits for it), never a second archive nor `busy`/`invalid_state`."""
    ws, ctl = slow_ws
    cli = subprocess.Popen(
        [XUM, "--host", "h1", "--json", "ws", "archive", ws["id"]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **host_env},
    )
    try:
        ssh = _ssh_child(cli)
        until((ctl / "started").exists, 60, message="the teardown to start")
        ssh.send_signal(signal.SIGKILL)
        # The CLI's second link: its own ssh, started once the first one died.
        until(
            lambda: any(
                c.name() == "ssh" and c.pid != ssh.pid
                for c in psutil.Process(cli.pid).children(recursive=True)
            ),
            60,
            message="the CLI's retry through a new ssh",
        )
        release(ctl)
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 0, err
    answer = json.loads(out)
    assert answer["workspace"]["id"] == ws["id"]
    assert answer["workspace"]["state"] == "archived"
    shown = xum_json(host_env, "--host", "h1", "ws", "show", ws["id"])["workspace"]
    assert shown["state"] == "archived"
    assert not Path(ws["path"]).exists()


def test_async_client_call_lost_and_events_resume(
    host_env: dict[str, str], slow_ws: tuple[dict[str, Any], Path]
) -> None:
    """AsyncClient(host=, retry_lost=False): the call in flight when ssh dies raises
    ConnectionLost (outcome unknown); a new client resumes the event stream with after_seq and
    sees what happened."""
    ws, ctl = slow_ws

    started = ctl / "started"

    async def scenario() -> None:
        lost: list[BaseException] = []
        async with (
            AsyncClient(host="h1", retry_lost=False) as client,
            client.subscribe(["workspace."]) as events,
        ):

            async def archive() -> None:
                try:
                    await client.call("workspace.archive", {"workspace_id": ws["id"]})
                except ConnectionLost as exc:
                    lost.append(exc)

            # A call that gets no answer in time through a host: its outcome is unknown too.
            with pytest.raises(ClientTimeout, match="the outcome is unknown: look with `xum"):
                await client.call("workspace.get", {"workspace_id": ws["id"]}, timeout=0.0)

            async with anyio.create_task_group() as tg:
                tg.start_soon(archive)
                # The archive's intent is committed (an event) and the teardown runs.
                with anyio.fail_after(60):
                    async for event in events:
                        if (event.data.get("workspace") or {}).get("state") == "archiving":
                            break
                await anyio.to_thread.run_sync(until, started.exists, 60)
                assert client.ssh_pid is not None
                os.kill(client.ssh_pid, signal.SIGKILL)
            epoch, position = events.epoch, events.position
        assert len(lost) == 1
        message = str(lost[0])
        assert "lost during workspace.archive" in message
        assert "ssh was killed by signal 9" in message
        assert "the outcome is unknown" in message
        assert f"xum --host h1 ws show {ws['id']}" in message

        await anyio.to_thread.run_sync(release, ctl)
        await anyio.to_thread.run_sync(wait_archived, Path(host_env["REMOTE_ROOT"]), ws["id"])
        async with (
            AsyncClient(host="h1") as again,
            again.subscribe(["workspace."], after_seq=position, epoch=epoch) as resumed,
        ):
            assert resumed.snapshot.resync_required is False
            replayed = [
                (e.data.get("workspace") or {}).get("state") for e in resumed.snapshot.events
            ]
            assert "archived" in replayed

    anyio.run(scenario)


def test_a_persistent_control_master_is_reused_and_left_alone(
    host_env: dict[str, str], sshd: SshServer, tmp_short: Path
) -> None:
    """`ControlMaster auto` + `ControlPersist` (a common ~/.ssh/config): the background master
    ssh forks leaves the client's process group, so closing a client neither hangs on it nor
    kills it, and the next client reuses it."""
    control = str(tmp_short / "cm-%C")
    options = {"ControlMaster": "auto", "ControlPath": control, "ControlPersist": "60"}
    add_host(HostEntry("cm", ALIAS, host_env["REMOTE_ROOT"], options))
    ssh = ["ssh", "-F", str(sshd.ssh_config), "-o", f"ControlPath={control}"]
    try:
        pids = set()
        for _ in range(2):
            with Client(host="cm") as client:
                pids.add(client.call("daemon.status")["pid"])
        assert len(pids) == 1
        check = subprocess.run(
            [*ssh, "-O", "check", ALIAS], capture_output=True, text=True, timeout=30, check=False
        )
        assert check.returncode == 0, check.stderr
        assert "Master running" in check.stderr
    finally:
        subprocess.run([*ssh, "-O", "exit", ALIAS], capture_output=True, timeout=30, check=False)


HOLDER = """
import sys
import time
from xum_client import Client
client = Client(host="h1")
print(client.ssh_pid, flush=True)
sys.stdin.read()  # until the test kills this process
"""


def test_a_killed_client_leaves_no_ssh(host_env: dict[str, str]) -> None:
    """A client SIGKILLed (no close, no cleanup) takes its ssh with it: the kernel closes the
    client's end of the socketpair, ssh reads the end of its stdin and exits (no orphan)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **host_env},
    )
    try:
        assert holder.stdout is not None
        ssh = identify(int(holder.stdout.readline()))
        assert alive(ssh)
        holder.kill()
        holder.wait()
        until(lambda: not alive(ssh), message="the orphaned ssh to exit")
    finally:
        holder.kill()
        holder.wait()


# -- commands that start or attach to a process, through a host --------------------------------


@pytest.fixture
def host_ws(host_env: dict[str, str], tmp_short: Path) -> str:
    """An active workspace `repo/one` on host h1; its checkout path (the host's)."""
    repo = make_repo(tmp_short / "repo")
    xum_json(host_env, "--host", "h1", "project", "add", str(repo))
    path: str = xum_json(host_env, "--host", "h1", "ws", "new", "repo", "one")["workspace"]["path"]
    return path


def test_run_through_a_host_streams_forwards_stdin_and_exits_with_the_code(
    host_env: dict[str, str], host_ws: str
) -> None:
    """`xum --host h1 run` runs on the host, in its checkout: output streamed back over the
    bridge, stdin forwarded over a second bridge connection, the exit code the process's."""
    done = subprocess.run(
        [XUM, "--host", "h1", "run", "repo/one", "--", "sh", "-c", "echo start; pwd; cat; exit 7"],
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **host_env},
    )
    assert done.returncode == 7, done.stderr
    assert done.stdout == f"start\n{host_ws}\nhello\n"
    # --detach: started there, the id printed, still running after the command returned.
    started = xum(
        host_env,
        "--host",
        "h1",
        "run",
        "--detach",
        "--kind",
        "agent",
        "repo/one",
        "--",
        "sleep",
        "600",
    )
    assert started.returncode == 0, started.stderr
    process_id = started.stdout.strip()
    listed = xum_json(host_env, "--host", "h1", "ps")["processes"]
    assert [(p["id"], p["state"]) for p in listed] == [(process_id, "running")]
    assert xum(host_env, "--host", "h1", "kill", process_id).returncode == 0


# ~10 s (a workspace made through ssh, then a run killed and waited out): reliability suite.
@pytest.mark.reliability
def test_a_run_through_a_host_whose_cli_is_killed_leaves_no_orphan(
    host_env: dict[str, str], host_ws: str
) -> None:
    """SIGKILL the CLI mid-run: both its ssh connections end, and the host's daemon stops the
    foreground process its connection owned (`session`), as it would locally."""
    cli = subprocess.Popen(
        [XUM, "--host", "h1", "run", "repo/one", "--", "sh", "-c", "echo started; exec sleep 600"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, **host_env},
        start_new_session=True,
    )
    try:
        assert cli.stdout is not None and cli.stdout.readline() == b"started\n"
        ssh = [identify(p.pid) for p in psutil.Process(cli.pid).children() if "ssh" in p.name()]
        assert len(ssh) == 2, ssh  # the output connection and the stdin one
        cli.kill()
        cli.wait(30)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(30)
    until(lambda: not any(alive(s) for s in ssh), 60, message="the CLI's ssh to exit")

    def stopped() -> dict[str, Any] | None:
        processes = xum_json(host_env, "--host", "h1", "ps", "--all")["processes"]
        return processes[0] if processes and processes[0]["state"] == "exited" else None

    process = until(stopped, 60, message="the daemon to stop the orphaned run")
    assert process["exit"]["stop_reason"] == "session"


def test_term_through_a_host_is_an_interactive_pty(host_env: dict[str, str], host_ws: str) -> None:
    code, _ = run_on_a_terminal(
        [XUM, "--host", "h1", "term", "repo/one", "--shell", "/bin/sh"],
        {**os.environ, **host_env},
        b"tty >/dev/null && echo hi-$((6*7)) && pwd; exit 5\n",
        b"hi-42",
        60,
    )
    assert code == 5


def test_a_proxy_commands_children_go_with_the_client(
    host_env: dict[str, str], tmp_short: Path
) -> None:
    """ssh's ProxyCommand and what it starts run in ssh's process group: closing the client
    stops that whole group, so nothing the proxy left behind outlives the connection."""
    if shutil.which("socat") is None:
        pytest.skip("socat is not installed (apt-get install socat)")
    marker = tmp_short / "proxy-child.pid"
    proxy = (
        f"sh -c 'sleep 600 </dev/null >/dev/null 2>&1 & echo $! > {marker}; "
        "exec socat - TCP:127.0.0.1:%p'"
    )
    add_host(HostEntry("px", ALIAS, host_env["REMOTE_ROOT"], {"ProxyCommand": proxy}))
    with Client(host="px") as client:
        assert client.call("daemon.status")["root"] == host_env["REMOTE_ROOT"]
        child = identify(int(marker.read_text()))
        assert alive(child)
    until(lambda: not alive(child), 30, message="the proxy's child to be stopped")


# -- a link that drops under a stream -------------------------------------------------------------


def _read_line(proc: subprocess.Popen[bytes], timeout: float = 60) -> bytes:
    """The next line `proc` writes on stdout, waited for with a deadline (never a read that
    could block the test for ever)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    line = b""
    deadline = time.monotonic() + timeout
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0, f"no line from the CLI in {timeout}s (so far: {line!r})"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 1)
            assert chunk, f"the CLI's stdout ended (so far: {line!r})"
            line += chunk
    return line


def _kill_ssh(cli: subprocess.Popen[bytes], count: int = 1) -> None:
    """SIGKILL the CLI's ssh processes, once `count` of them run (the link drops, the host and
    its daemon are fine)."""

    def found() -> list[psutil.Process] | None:
        try:
            ssh = [p for p in psutil.Process(cli.pid).children() if p.name() == "ssh"]
        except psutil.NoSuchProcess:
            return None  # a child gone while listed: look again
        return ssh if len(ssh) == count else None

    for proc in until(found, 60, message=f"{count} ssh process(es) of the CLI"):
        proc.send_signal(signal.SIGKILL)


def _cli(host_env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [XUM, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **host_env},
    )


def _finish(cli: subprocess.Popen[bytes]) -> tuple[str, str]:
    try:
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(30)
    return out.decode(), err.decode()


def test_events_through_a_host_whose_link_drops_name_the_host_and_why(
    host_env: dict[str, str],
) -> None:
    """`xum --host h1 events`: ssh killed under the stream is connection_lost naming the host
    and ssh's status (in the message and in `data`), and how to resume; never "the daemon
    closed the connection" with nothing else."""
    cli = _cli(host_env, "--host", "h1", "--json", "events")
    try:
        answer = json.loads(_read_line(cli))
        _kill_ssh(cli)
    finally:
        out, err = _finish(cli)
    assert cli.returncode == 5, (out, err)
    error = json.loads(out)["error"]
    assert error["kind"] == "connection_lost"
    assert error["data"]["host"] == "h1"
    assert error["data"]["ssh_status"] == -signal.SIGKILL
    assert error["message"].startswith("connection to host 'h1' lost (ssh was killed by signal 9)")
    resume = f"xum --host h1 events --epoch={answer['epoch']} --after-seq={answer['seq']}"
    assert f"resume after the last event shown with `{resume}`" in error["message"]
    # The same without --json: one line, its kind first.
    cli = _cli(host_env, "--host", "h1", "events")
    try:
        assert _read_line(cli).startswith(b"epoch ")
        _kill_ssh(cli)
    finally:
        out, err = _finish(cli)
    assert cli.returncode == 5, (out, err)
    assert err.startswith("xum: connection_lost: connection to host 'h1' lost (ssh was killed")
    assert err.count("\n") == 1, err


def test_all_hosts_events_say_which_host_lost_its_link_and_why(
    host_env: dict[str, str], tmp_short: Path
) -> None:
    """`xum events --all-hosts`: a host's link killed is a `lost` item naming the host, the
    error's kind and ssh's status; then the stream goes on through a new ssh."""
    env = {**host_env, "XUM_ROOT": str(tmp_short / "no-local-daemon")}
    cli = _cli(env, "--json", "events", "--all-hosts")
    try:

        def next_of_h1() -> dict[str, Any]:
            while True:
                item: dict[str, Any] = json.loads(_read_line(cli))
                if item["host"] == "h1":
                    return item

        assert next_of_h1()["kind"] == "subscribed"
        _kill_ssh(cli)
        lost = next_of_h1()
        assert lost["kind"] == "lost", lost
        assert lost["data"]["kind"] == "connection_lost"
        assert lost["data"]["ssh_status"] == -signal.SIGKILL
        assert "connection to host 'h1' lost (ssh was killed by signal 9)" in lost["data"]["error"]
        assert next_of_h1()["kind"] == "subscribed"  # reconnected
    finally:
        cli.kill()
        _finish(cli)


@pytest.mark.parametrize("kind", ["agent", "exec"])
def test_run_through_a_host_whose_link_drops_is_connection_lost_not_a_daemon_stop(
    host_env: dict[str, str], host_ws: str, kind: str
) -> None:
    """`xum --host h1 run`: both of its ssh links killed while the host and its daemon are fine
    is connection_lost (exit 5) naming the host, ssh's status and whether the process still
    runs there (asked over a new link), never "the daemon is stopping" (exit 75). An agent is
    not tied to the connection and runs on; a foreground exec is stopped by the host's daemon
    once it sees its connection close, which the look waits for."""
    cli = _cli(
        host_env,
        "--host", "h1", "--json", "run", "--kind", kind, "repo/one", "--",
        "sh", "-c", "echo started; exec sleep 600",
    )  # fmt: skip
    try:
        assert _read_line(cli) == b"started\n"
        _kill_ssh(cli, 2)  # the output's link and stdin's
    finally:
        out, err = _finish(cli)
    assert cli.returncode == 5, (out, err)
    error = json.loads(out)["error"]
    assert error["kind"] == "connection_lost", error
    process_id = error["data"]["process_id"]
    assert error["data"]["host"] == "h1"
    assert error["data"]["ssh_status"] == -signal.SIGKILL
    assert error["message"].startswith(
        f"connection to host 'h1' lost while following {process_id} (ssh was killed by signal 9)"
    )
    # What it said is so (`ps` through the host agrees).
    listed = xum_json(host_env, "--host", "h1", "ps", "--all")["processes"]
    (process,) = [p for p in listed if p["id"] == process_id]
    if kind == "agent":
        assert error["data"]["running"] is True
        assert f"{process_id} is still running there" in error["message"]
        assert f"`xum --host h1 kill {process_id}`" in error["message"]
        assert process["state"] == "running"
        assert xum(host_env, "--host", "h1", "kill", process_id).returncode == 0
    else:
        assert error["data"]["running"] is False
        assert (
            f"{process_id} is no longer running there (stopped because its caller's "
            "connection closed)" in error["message"]
        )
        assert process["state"] == "exited"
        assert process["exit"]["stop_reason"] == "session"
