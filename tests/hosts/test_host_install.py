"""`xum host install NAME` against a real OpenSSH server on loopback (tests/support/sshd.py).

The "host" is this machine behind sshd, with its own XDG_DATA_HOME (the install goes into the
test's temp directory) and a PATH the test chooses: the remote side has no network access of
its own to lean on, since everything it installs comes over the ssh connection.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import xumd
from xum_client import hostinstall
from xum_client.hostinstall import HostPython, Probe, choose_python, platform_tags
from xum_client.hosts import HostEntry

from tests.support.daemon import short_tmpdir
from tests.support.sshd import ALIAS, SshServer, stop_root_daemon

XUM = str(Path(sys.executable).parent / "xum")


def run_xum(
    env: dict[str, str], *args: str, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [XUM, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}
    )


@pytest.fixture(scope="module")
def wheel_cache() -> Iterator[Path]:
    """One wheel cache for this module's installs: the first fetches, the others reuse."""
    path = short_tmpdir("xumwc-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Host:
    """One sshd, one host entry `h` (its own remote root), the environment to reach it."""

    def __init__(self, base: Path, server: SshServer) -> None:
        self.base = base
        self.server = server
        self.root = base / "r"
        self.env = {**server.env(), "XUM_HOSTS_FILE": str(base / "hosts.toml")}
        self.data = server.data_home / "xum"

    def add(self, name: str = "h") -> None:
        done = run_xum(self.env, "host", "add", name, ALIAS, "--remote-root", str(self.root))
        assert done.returncode == 0, done.stderr


@pytest.fixture
def host(wheel_cache: Path) -> Iterator[Host]:
    base = short_tmpdir("xumhi-")
    server = SshServer(base)
    try:
        server.start()
        h = Host(base, server)
        h.env["XDG_CACHE_HOME"] = str(wheel_cache)
        h.add()
        yield h
    finally:
        stop_root_daemon(base / "r")
        server.close()
        shutil.rmtree(base, ignore_errors=True)


# -- what fits the host (pure functions) -----------------------------------------------------


def _python(platform: str, libc: str, libc_version: tuple[int, int] | None) -> HostPython:
    return HostPython("/usr/bin/python3", (3, 11, 2), "cpython", platform, libc, libc_version)


def test_platform_tags_for_glibc_musl_and_refusals() -> None:
    tags = platform_tags(_python("linux-x86_64", "glibc", (2, 36)))
    assert tags[0] == "manylinux_2_36_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert tags[-1] == "linux_x86_64" and "manylinux_2_37_x86_64" not in tags
    arm = platform_tags(_python("linux-aarch64", "glibc", (2, 31)))
    assert "manylinux2014_aarch64" in arm and "manylinux2010_aarch64" not in arm
    musl = platform_tags(_python("linux-x86_64", "musl", (1, 2)))
    assert musl == [
        "musllinux_1_2_x86_64",
        "musllinux_1_1_x86_64",
        "musllinux_1_0_x86_64",
        "linux_x86_64",
    ]
    with pytest.raises(hostinstall.HostInstallError, match="supports Linux hosts"):
        platform_tags(_python("macosx-14.0-arm64", "", None))


def test_no_cpython_3_11_is_one_clear_line() -> None:
    entry = HostEntry("h", "dest")
    old = HostPython("/usr/bin/python3", (3, 9, 18), "cpython", "linux-x86_64", "glibc", (2, 36))
    pypy = HostPython("/opt/pypy3", (3, 11, 0), "pypy", "linux-x86_64", "glibc", (2, 36))
    with pytest.raises(hostinstall.HostInstallError) as caught:
        choose_python(entry, Probe(pythons=[old, pypy]))
    message = str(caught.value)
    assert "\n" not in message
    assert "no CPython >= 3.11" in message
    assert "cpython 3.9.18 at /usr/bin/python3" in message and "pypy 3.11.0" in message
    with pytest.raises(hostinstall.HostInstallError, match="no python3 on its PATH"):
        choose_python(entry, Probe())


def test_the_wheel_is_the_running_xum(tmp_short: Path) -> None:
    wheel = hostinstall.build_xum_wheel(tmp_short)
    assert wheel.name == f"xum-{xumd.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(f"xum-{xumd.__version__}.dist-info/METADATA").decode()
        entry_points = zf.read(f"xum-{xumd.__version__}.dist-info/entry_points.txt").decode()
        shipped_cli = zf.read("xum_client/cli.py")
    assert shipped_cli == Path(hostinstall.__file__).with_name("cli.py").read_bytes()
    assert "xumd/store/migrations/0001_initial.sql" in names or any(
        n.startswith("xumd/store/migrations/") and n.endswith(".sql") for n in names
    )
    assert {"xumd/py.typed", "xum_protocol/py.typed", "xum_client/py.typed"} <= names
    assert not any("__pycache__" in n for n in names)
    # Every file the packages have here goes (a new kind of package data must not be left out).
    for package in hostinstall.PACKAGES:
        base = Path(__import__(package).__file__).parent
        for path in base.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                assert f"{package}/{path.relative_to(base).as_posix()}" in names, path
    assert "Requires-Dist: pydantic" in metadata and "pytest" not in metadata
    # The commands are the installed distribution's, whatever they point at.
    installed = importlib.metadata.distribution("xum").entry_points
    scripts = {f"{ep.name} = {ep.value}" for ep in installed if ep.group == "console_scripts"}
    assert {"xum", "xumd"} <= {line.split(" = ")[0] for line in scripts}
    assert set(entry_points.strip().splitlines()[1:]) == scripts


# -- against the real sshd ---------------------------------------------------------------------


# Slow (a wheelhouse built and a venv installed: tens of seconds on a loaded machine), so in the
# reliability suite, which CI runs (`make test-reliability-sample`).
@pytest.mark.reliability
@pytest.mark.timeout(900)
def test_install_then_idempotent_then_the_host_runs_the_installed_copy(host: Host) -> None:
    done = run_xum(host.env, "host", "install", "h", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["changed"] is True and result["version"] == xumd.__version__
    assert result["installed_before"] is None
    link = host.data / "venv"
    assert link.is_symlink()
    venv = link.resolve()
    assert venv.parent == host.data / "venvs" and venv.name.startswith(xumd.__version__ + "-")
    assert result["venv"] == str(venv)
    said = subprocess.run([str(link / "bin" / "xum"), "--version"], capture_output=True, text=True)
    assert said.stdout.strip() == f"xum, version {xumd.__version__}"
    # Nothing left behind but the link, the versions, the lock.
    assert sorted(p.name for p in host.data.iterdir()) == ["install.lock", "venv", "venvs"]

    # Same version again: nothing to do, and it says so.
    again = run_xum(host.env, "host", "install", "h")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"host h already has xum {xumd.__version__}: nothing to do"
    assert link.resolve() == venv

    # Through the host, the daemon the bridge starts is the installed copy.
    status = run_xum(host.env, "--host", "h", "status", "--json", timeout=120)
    assert status.returncode == 0, status.stderr
    pid = json.loads(status.stdout)["pid"]
    argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert argv0.startswith(str(venv) + "/bin/python"), argv0


def test_a_host_without_python_3_11_says_so_in_one_line(host: Host) -> None:
    # A real interpreter (pyenv's shims are scripts that need pyenv itself). Named with
    # --python: the remote login shell's own start-up files (root's ~/.bashrc here) decide the
    # host's PATH, so the test cannot take every newer python3 off it.
    old = "/root/.pyenv/versions/3.9.18/bin/python3.9"
    if not os.path.exists(old):
        pytest.skip("no Python 3.9 here to play the host's python3")
    done = run_xum(host.env, "host", "install", "h", "--python", old)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == (
        f"xum: error: host h (xumtest1) has no CPython >= 3.11 (found: cpython 3.9.18 at {old}); "
        "install one there (e.g. `apt-get install python3.11`), or name it with --python"
    )
    # Nothing but progress before it, nothing installed.
    assert [line for line in lines if not line.endswith(" ...")] == [lines[-1]]
    assert not (host.data / "venv").exists()


def test_a_python_that_does_not_run_is_named(host: Host) -> None:
    broken = host.base / "python3"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    done = run_xum(host.env, "host", "install", "h", "--python", str(broken), "--json")
    assert done.returncode == 1
    error = json.loads(done.stdout)["error"]
    assert f"found: {broken} (does not run)" in error["message"]


def test_an_unreachable_host_is_one_line(host: Host) -> None:
    done = run_xum(host.env, "host", "add", "down", "xumtest-down")
    assert done.returncode == 0, done.stderr
    done = run_xum(host.env, "host", "install", "down")
    assert done.returncode == 6  # a host that cannot be reached, as for any command
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("xum: host_unreachable: host 'down' (xumtest-down) is unreachable: ")
    assert "Connection refused" in last
    done = run_xum(host.env, "host", "install", "down", "--json")
    assert json.loads(done.stdout)["error"]["kind"] == "host_unreachable"


@pytest.mark.reliability
@pytest.mark.timeout(900)
def test_a_host_with_another_python_gets_wheels_for_it_and_force_reinstalls(host: Host) -> None:
    other = "/root/.pyenv/versions/3.12.1/bin/python3.12"
    if not os.path.exists(other):
        pytest.skip("no Python 3.12 here to play the host's interpreter")
    done = run_xum(host.env, "host", "install", "h", "--python", other, "--json")
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout)
    # The compiled dependencies are the host's (cp312), not this Python's.
    assert any(w.startswith("pydantic_core-") and "-cp312-" in w for w in first["wheels"])
    link = host.data / "venv"
    assert (link / "lib" / "python3.12" / "site-packages" / "xum_client").is_dir()

    # --force while a process runs from the first (as a daemon started before would): a fresh
    # venv beside it, the link moved, the first kept, saying why.
    ready = "import sys, pydantic_core; print('ready', flush=True); sys.stdin.read()"
    user = subprocess.Popen(
        [str(Path(first["venv"]) / "bin" / "python"), "-c", ready],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert user.stdout is not None and user.stdout.readline().strip() == "ready"
        done = run_xum(host.env, "host", "install", "h", "--python", other, "--force", "--json")
    finally:
        assert user.stdin is not None
        user.stdin.close()
        user.wait(30)
    assert done.returncode == 0, done.stderr
    second = json.loads(done.stdout)
    assert second["changed"] is True and second["installed_before"] == xumd.__version__
    assert second["venv"] != first["venv"] and second["previous"] == first["venv"]
    assert second["pruned"] == [] and second["kept"] == [first["venv"]]
    assert second["why"] == {first["venv"]: f"in use by process {user.pid}"}
    assert link.resolve() == Path(second["venv"]) and Path(first["venv"]).is_dir()

    # Once nothing runs from them, the next install removes both older ones, and never a
    # directory someone made there by hand.
    by_hand = host.data / "venvs" / "mine"
    by_hand.mkdir()
    done = run_xum(host.env, "host", "install", "h", "--python", other, "--force")
    assert done.returncode == 0, done.stderr
    third = link.resolve()
    assert sorted(p.name for p in (host.data / "venvs").iterdir()) == sorted(["mine", third.name])
    lines = done.stdout.strip().splitlines()
    assert sorted(lines[1:]) == sorted(
        [
            f"removed the older {first['venv']}",
            f"removed the older {second['venv']}",
            f"kept {by_hand}: not made by xum host install (no .xum-host-install)",
        ]
    )


def test_a_venv_made_by_hand_is_never_replaced(host: Host) -> None:
    made = host.data / "venv"
    made.mkdir(parents=True)
    (made / "mine").write_text("keep")
    done = run_xum(host.env, "host", "install", "h")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"xum: error: host h (xumtest1): {made} exists and is not the link "
        "`xum host install` makes: move it away first"
    )
    assert (made / "mine").read_text() == "keep" and not (host.data / "venvs").exists()


@pytest.mark.reliability
@pytest.mark.timeout(900)
def test_one_install_at_a_time_per_host(host: Host) -> None:
    # Another install holds the host's lock (this test plays it: the host is this machine).
    host.data.mkdir(parents=True)
    with open(host.data / "install.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = run_xum(host.env, "host", "install", "h")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "xum: error: host h (xumtest1): install failed: "
        "another xum host install is running on this host"
    )
    # Nothing half-made is left: no link, no version directory, no staged wheels.
    assert not (host.data / "venv").exists()
    assert list((host.data / "venvs").iterdir()) == []
    assert not [p for p in host.data.iterdir() if p.name.startswith(".wheels-")]


@pytest.mark.reliability
def test_a_failed_install_on_the_host_leaves_nothing_half_made(host: Host, tmp_short: Path) -> None:
    """pip fails on the host (a wheelhouse without xum's dependencies): the error says so in one
    line and neither a link nor a version directory nor staged wheels are left."""
    entry = HostEntry("h", ALIAS)
    house = tmp_short / "house"
    wheels = [hostinstall.build_xum_wheel(house), hostinstall._pip_wheel(house, 120)]
    python = HostPython(sys.executable, (3, 11, 0), "cpython", "linux-x86_64", "glibc", None)
    env = {**os.environ, **host.server.env()}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        with pytest.raises(hostinstall.HostInstallError) as caught:
            hostinstall.push_and_install(entry, python, wheels)
    message = str(caught.value)
    assert message.startswith("host h (xumtest1): install failed: pip install: ")
    assert "\n" not in message
    assert not (host.data / "venv").exists()
    assert list((host.data / "venvs").iterdir()) == []
    assert not [p for p in host.data.iterdir() if p.name.startswith(".wheels-")]


def test_a_host_that_never_answers_the_probe_is_stopped_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ssh that connects and then hangs (played by a shell that sleeps, in ssh's place)."""
    monkeypatch.setenv("XUM_SSH", "sh -c 'exec sleep 600' ssh")
    with pytest.raises(hostinstall.HostInstallError) as caught:
        hostinstall.probe_host(HostEntry("h", "box"), timeout=1)
    assert str(caught.value) == (
        "host h (box): no answer within 1s while asking which Python it has"
    )


def test_a_pip_that_never_finishes_is_stopped_at_its_deadline(tmp_short: Path) -> None:
    """pip asking an index that accepts the connection and never answers."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as index:
        index.bind(("127.0.0.1", 0))
        index.listen(1)
        url = f"http://127.0.0.1:{index.getsockname()[1]}/simple"
        args = ["download", "--no-cache-dir", "--index-url", url, "--timeout", "600"]
        args += ["--retries", "0", "-d", str(tmp_short), "xum-no-such-dist"]
        with pytest.raises(hostinstall.HostInstallError) as caught:
            hostinstall._run_pip(args, "fetching", 3)
    assert str(caught.value) == "fetching: pip did not finish within 3s"


def test_ssh_ending_mid_install_says_the_outcome_is_unknown(
    tmp_short: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops (ssh's 255) with no word from the install script: it may have
    finished on the host, so the message must not say it failed. (An "ssh" that reads the
    wheels, then ends as a dropped connection does.)"""
    monkeypatch.setenv(
        "XUM_SSH", "sh -c 'cat >/dev/null; echo \"Connection reset by peer\" >&2; exit 255' ssh"
    )
    wheel = tmp_short / "x-1-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel")
    python = HostPython("/usr/bin/python3", (3, 11, 0), "cpython", "linux-x86_64", "glibc", None)
    with pytest.raises(hostinstall.HostInstallError) as caught:
        hostinstall.push_and_install(HostEntry("h", "box"), python, [wheel])
    assert str(caught.value) == (
        "host h (box): ssh ended while installing (Connection reset by peer): the install may or "
        "may not have finished there; run `xum host install h` again to see (it does nothing "
        "when this version is in place)"
    )
