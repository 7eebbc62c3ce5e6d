"""The hosts file and the ssh command (`xum_client.hosts`), and `xum host add|ls|rm` (no sshd)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from xum_client import hosts
from xum_client.hosts import HostConfigError, HostEntry

XUM = str(Path(sys.executable).parent / "xum")


@pytest.fixture
def hosts_path(tmp_short: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_short / "cfg" / "hosts.toml"
    monkeypatch.setenv("XUM_HOSTS_FILE", str(path))
    return path


def xum(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [XUM, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **env},
    )


# -- where the file is -------------------------------------------------------------------------


def test_hosts_file_location(monkeypatch: pytest.MonkeyPatch, tmp_short: Path) -> None:
    monkeypatch.delenv("XUM_HOSTS_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_short / "xdg"))
    assert hosts.hosts_file() == tmp_short / "xdg" / "xum" / "hosts.toml"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_short / "home"))
    assert hosts.hosts_file() == tmp_short / "home" / ".config" / "xum" / "hosts.toml"
    monkeypatch.setenv("XUM_HOSTS_FILE", str(tmp_short / "elsewhere.toml"))
    assert hosts.hosts_file() == tmp_short / "elsewhere.toml"


# -- add, load, remove -------------------------------------------------------------------------


def test_add_load_remove_round_trip(hosts_path: Path) -> None:
    assert hosts.load_hosts() == {}
    odd = HostEntry("dev-box.1", "me@dev.example", '/srv/x "quoted" \\ root', {"Port": "2222"})
    hosts.add_host(odd)
    hosts.add_host(HostEntry("b", "alias"))
    loaded = hosts.load_hosts()
    assert loaded == {"dev-box.1": odd, "b": HostEntry("b", "alias", None, {})}
    # Written whole: no temporary left behind (the lock file stays, empty).
    assert sorted(p.name for p in hosts_path.parent.iterdir()) == [".hosts.toml.lock", "hosts.toml"]

    with pytest.raises(HostConfigError, match="already exists"):
        hosts.add_host(HostEntry("b", "other"))
    hosts.add_host(HostEntry("b", "other"), replace=True)
    assert hosts.load_hosts()["b"].dest == "other"

    assert hosts.remove_host("b").dest == "other"
    assert list(hosts.load_hosts()) == ["dev-box.1"]
    with pytest.raises(HostConfigError, match="no host 'b'"):
        hosts.remove_host("b")
    with pytest.raises(HostConfigError, match=r"no host 'zz' in .*known: dev-box.1"):
        hosts.get_host("zz")


def test_a_failed_write_leaves_the_old_file(
    hosts_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails at the rename (a fault: no space, EIO) leaves the old file whole and
    no temporary behind."""
    hosts.add_host(HostEntry("a", "alias-a"))
    before = hosts_path.read_text()

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hosts.os, "replace", failing_replace)
    with pytest.raises(HostConfigError, match=r"cannot write hosts file .*No space left"):
        hosts.add_host(HostEntry("b", "alias-b"))
    assert hosts_path.read_text() == before
    assert sorted(p.name for p in hosts_path.parent.iterdir()) == [".hosts.toml.lock", "hosts.toml"]


def test_malformed_file_names_file_and_line(hosts_path: Path) -> None:
    hosts_path.parent.mkdir(parents=True)
    hosts_path.write_text('[hosts.a]\ndest = "x"\n\n[hosts.b]\ndest = \n')
    with pytest.raises(HostConfigError) as info:
        hosts.load_hosts()
    assert str(hosts_path) in str(info.value)
    assert "line 5" in str(info.value)

    hosts_path.write_text('[hosts.a]\ndest = "x"\n\n[hosts.b]\nremote_root = "/r"\n')
    with pytest.raises(HostConfigError) as info:
        hosts.load_hosts()
    assert f"{hosts_path}, line 4 ([hosts.b]): `dest` (a string) is required" in str(info.value)

    hosts_path.write_text('[hosts.a]\ndest = "x"\nport = 22\n')
    with pytest.raises(HostConfigError, match=r"line 1 \(\[hosts.a\]\): unknown key 'port'"):
        hosts.load_hosts()

    hosts_path.write_text('[hosts."a b"]\ndest = "x"\n')
    with pytest.raises(HostConfigError, match="invalid host name 'a b'"):
        hosts.load_hosts()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (HostEntry("a;b", "x"), "invalid host name"),
        (HostEntry("-a", "x"), "invalid host name"),
        (HostEntry("a", "-oProxyCommand=touch /tmp/pwned"), "invalid destination"),
        (HostEntry("a", "me@host; rm -rf ~"), "invalid destination"),
        (HostEntry("a", "host\nProxyCommand x"), "invalid destination"),
        (HostEntry("a", "x", "/r\n"), "invalid remote root"),
        (HostEntry("a", "x", ""), "invalid remote root"),
        (HostEntry("a", "x", None, {"Proxy=Command": "x"}), "invalid ssh option name"),
        (HostEntry("a", "x", None, {"ProxyCommand": "a\nb"}), "invalid value"),
    ],
)
def test_invalid_entries_are_refused(hosts_path: Path, entry: HostEntry, message: str) -> None:
    with pytest.raises(HostConfigError, match=message):
        hosts.add_host(entry)
    assert not hosts_path.exists()


# -- the ssh command ---------------------------------------------------------------------------


def test_ssh_command_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XUM_SSH", raising=False)
    entry = HostEntry("h", "me@h", "/srv/root", {"ConnectTimeout": "5", "Port": "2200"})
    argv = hosts.ssh_command(entry)
    assert argv[:-1] == [
        "ssh",
        "-T",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-o",
        "Port=2200",
        "--",
        "me@h",
    ]
    assert argv[-1].endswith(" xum bridge --root /srv/root")
    monkeypatch.setenv("XUM_SSH", "ssh -F '/tmp/my config'")
    assert hosts.ssh_command(HostEntry("h", "h"))[:3] == ["ssh", "-F", "/tmp/my config"]
    # No remote root: the host's default root.
    assert hosts.ssh_command(HostEntry("h", "h"))[-1].endswith(" xum bridge")


XUM_SSH_CASES = Path(__file__).parents[1] / "support" / "xum_ssh_cases.json"


def xum_ssh_cases() -> list[dict[str, Any]]:
    """$XUM_SSH texts and the words every client splits them into (or the refusal): the table
    the Neovim and TypeScript tests hold their clients to as well."""
    cases: list[dict[str, Any]] = json.loads(XUM_SSH_CASES.read_text())["cases"]
    return cases


@pytest.mark.parametrize("case", xum_ssh_cases(), ids=lambda case: repr(case["text"]))
def test_xum_ssh_is_split_as_a_shell_would(
    case: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XUM_SSH", case["text"])
    if "error" in case:
        # A clear refusal naming the variable, never a traceback from shlex.
        with pytest.raises(HostConfigError, match=rf"\$XUM_SSH .*{case['error']}"):
            hosts.ssh_program()
    else:
        assert hosts.ssh_program() == case["words"]


HOSTS_FILE_CASES = Path(__file__).parents[1] / "support" / "hosts_file_cases.json"


def hosts_file_cases() -> list[dict[str, Any]]:
    """Hosts files and what every client reads from them (or that it refuses them): the table
    the TypeScript client's own TOML reader is held to (clients/ts/test/hosts.test.ts)."""
    cases: list[dict[str, Any]] = json.loads(HOSTS_FILE_CASES.read_text())["cases"]
    return cases


@pytest.mark.parametrize("case", hosts_file_cases(), ids=lambda case: case["name"])
def test_a_hosts_file_reads_as_the_shared_cases_say(case: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "hosts.toml"
    path.write_bytes(case["text"].encode())
    if case.get("error"):
        with pytest.raises(HostConfigError, match=str(path)):
            hosts.load_hosts(path)
        return
    got = {
        name: {"dest": e.dest, "remote_root": e.remote_root, "ssh_options": e.ssh_options}
        for name, e in hosts.load_hosts(path).items()
    }
    assert got == case["hosts"]


SSH_FAILURES = Path(__file__).parents[1] / "support" / "ssh_failures.json"


def ssh_failures() -> dict[str, Any]:
    """ssh exit statuses and stderr, and the kind and message each client gives them: the table
    the Neovim and TypeScript tests hold their clients to as well."""
    table: dict[str, Any] = json.loads(SSH_FAILURES.read_text())
    return table


@pytest.mark.parametrize("case", ssh_failures()["cases"], ids=lambda case: case["message"][:60])
def test_an_ssh_failure_is_classified(case: dict[str, Any]) -> None:
    from xum_client.sshlink import classify

    entry = HostEntry(**ssh_failures()["entry"])
    error = classify(entry, case["status"], case["stderr"])
    assert (error.kind, str(error)) == (case["kind"], case["message"])


def human_and_json(env: dict[str, str], *args: str) -> tuple[str, dict[str, Any], int]:
    """The same failing command twice: its stderr line, and its `--json` error object (both
    with the same exit status)."""
    human = xum(env, *args)
    as_json = xum(env, "--json", *args)
    assert as_json.returncode == human.returncode, (human.stderr, as_json.stdout)
    assert human.stdout == "", human.stdout
    error: dict[str, Any] = json.loads(as_json.stdout)["error"]
    return human.stderr, error, human.returncode


def _failing_ssh(path: Path, status: int, stderr: str) -> str:
    """An $XUM_SSH that ends as an ssh would: `stderr` on its stderr, then exit `status` (a
    negative one: killed by that signal)."""
    (path.parent / f"{path.name}.err").write_text(stderr)
    end = f"kill -{-status} $$" if status < 0 else f"exit {status}"
    path.write_text(f'#!/bin/sh\ncat "{path}.err" >&2\n{end}\n')
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(
    "case", ssh_failures()["cases"], ids=lambda case: f"{case['status']}-{case['kind']}"
)
def test_every_ssh_failure_reads_kind_then_message(
    case: dict[str, Any], hosts_path: Path, tmp_short: Path
) -> None:
    """README: without --json an error is `xum: KIND: MESSAGE`, the kind and message of its
    `--json` form, host errors included (every ssh failure of the shared table, through the
    real CLI)."""
    entry = ssh_failures()["entry"]
    hosts.add_host(HostEntry(entry["name"], entry["dest"]))
    env = {
        "XUM_HOSTS_FILE": str(hosts_path),
        "XUM_SSH": _failing_ssh(tmp_short / "ssh", case["status"], case["stderr"]),
    }
    line, error, code = human_and_json(env, "--host", entry["name"], "ws", "ls")
    assert code == 6, line
    assert (error["kind"], error["message"]) == (case["kind"], case["message"])
    assert line == f"xum: {case['kind']}: {case['message']}\n"


def test_host_commands_errors_read_kind_then_message(hosts_path: Path) -> None:
    """`xum host add|rm|check` refusing (a bad name, a host not in the file) reads `xum: KIND:
    MESSAGE` as every error does, not click's `Error: MESSAGE`."""
    env = {"XUM_HOSTS_FILE": str(hosts_path)}
    for args in (["host", "add", "a;b", "x"], ["host", "rm", "nope"], ["host", "check", "nope"]):
        line, error, code = human_and_json(env, *args)
        assert code == 1, (args, line)
        assert line == f"xum: {error['kind']}: {error['message']}\n", args


@pytest.mark.parametrize(
    "case", [c for c in xum_ssh_cases() if "error" in c], ids=lambda case: repr(case["text"])
)
def test_an_xum_ssh_that_cannot_be_split_reads_kind_then_message(
    case: dict[str, Any], hosts_path: Path
) -> None:
    hosts.add_host(HostEntry("h", "alias"))
    env = {"XUM_HOSTS_FILE": str(hosts_path), "XUM_SSH": case["text"]}
    line, error, code = human_and_json(env, "--host", "h", "ws", "ls")
    assert code == 1, line
    assert case["error"] in error["message"]
    assert line == f"xum: {error['kind']}: {error['message']}\n"


def _fake_xum(bin_dir: Path, log: Path) -> None:
    bin_dir.mkdir(parents=True)
    script = bin_dir / "xum"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$0" "$@" > {log}\n')
    script.chmod(0o755)


def test_remote_command_quotes_everything(tmp_short: Path) -> None:
    """The remote line, run by a real shell as sshd would run it, gives the host's xum exactly
    the arguments meant, and nothing in them runs."""
    log = tmp_short / "argv"
    _fake_xum(tmp_short / "bin", log)
    pwned = tmp_short / "pwned"
    root = f'/r/$(touch {pwned}) `touch {pwned}`; touch {pwned} \'"x" $HOME'
    entry = HostEntry("h", "h", root)
    line = hosts.ssh_command(entry)[-1]
    env = {"PATH": f"{tmp_short / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_short)}
    env["XDG_DATA_HOME"] = str(tmp_short / "nodata")
    subprocess.run(["sh", "-c", line], env=env, check=True, timeout=30)
    assert log.read_text().splitlines()[1:] == ["bridge", "--root", root]
    assert not pwned.exists()


def test_remote_command_prefers_the_data_dir_venv(tmp_short: Path) -> None:
    """Where `xum host install` puts xum (the data directory's venv) wins over PATH."""
    on_path, installed = tmp_short / "on-path.log", tmp_short / "installed.log"
    _fake_xum(tmp_short / "bin", on_path)
    _fake_xum(tmp_short / "data" / "xum" / "venv" / "bin", installed)
    line = hosts.ssh_command(HostEntry("h", "h"))[-1]
    env = {"PATH": f"{tmp_short / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_short / "home")}
    subprocess.run(["sh", "-c", line], env={**env, "XDG_DATA_HOME": str(tmp_short / "data")})
    assert installed.read_text().splitlines()[1:] == ["bridge"]
    assert not on_path.exists()
    # $HOME/.local/share without XDG_DATA_HOME
    home_venv = tmp_short / "home" / ".local" / "share" / "xum" / "venv" / "bin"
    home_log = tmp_short / "home.log"
    _fake_xum(home_venv, home_log)
    subprocess.run(["sh", "-c", line], env=env, check=True, timeout=30)
    assert home_log.exists()
    # Not on PATH, but in ~/.local/bin (pipx, pip --user): found there.
    local_bin_log = tmp_short / "local-bin.log"
    _fake_xum(tmp_short / "home2" / ".local" / "bin", local_bin_log)
    env2 = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_short / "home2")}
    subprocess.run(["sh", "-c", line], env=env2, check=True, timeout=30)
    assert local_bin_log.read_text().splitlines()[1:] == ["bridge"]
    # None: the shell's own "not found", status 127 (what the client reports as no xum).
    done = subprocess.run(
        ["sh", "-c", line],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_short / "nohome")},
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == hosts.EXIT_COMMAND_NOT_FOUND


# -- the CLI -----------------------------------------------------------------------------------


def test_cli_host_add_ls_rm(hosts_path: Path) -> None:
    env = {"XUM_HOSTS_FILE": str(hosts_path)}
    added = xum(env, "host", "add", "dev", "me@dev", "--remote-root", "/srv/x", "--ssh-option",
                "ConnectTimeout=5", "--json")  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["host"] == {
        "name": "dev",
        "dest": "me@dev",
        "remote_root": "/srv/x",
        "ssh_options": {"ConnectTimeout": "5"},
    }
    assert xum(env, "host", "add", "other", "alias").returncode == 0
    listed = json.loads(xum(env, "host", "ls", "--json").stdout)
    assert [h["name"] for h in listed["hosts"]] == ["dev", "other"]
    assert listed["file"] == str(hosts_path)
    text = xum(env, "host", "ls").stdout
    assert "dev" in text and "me@dev" in text and "ConnectTimeout=5" in text

    again = xum(env, "host", "add", "dev", "x")
    assert again.returncode == 1
    assert "already exists" in again.stderr

    bad = xum(env, "host", "add", "a;b", "x")
    assert bad.returncode == 1
    assert bad.stderr.count("\n") == 1 and "invalid host name" in bad.stderr
    bad_option = xum(env, "host", "add", "c", "x", "--ssh-option", "novalue")
    assert bad_option.returncode == 2

    assert xum(env, "host", "rm", "other").returncode == 0
    assert [h["name"] for h in json.loads(xum(env, "host", "ls", "--json").stdout)["hosts"]] == [
        "dev"
    ]
    missing = xum(env, "host", "rm", "other")
    assert missing.returncode == 1 and "no host 'other'" in missing.stderr


def test_cli_unknown_host_is_one_clear_line(hosts_path: Path) -> None:
    env = {"XUM_HOSTS_FILE": str(hosts_path)}
    for args, extra in ((["--host", "nope"], {}), ([], {"XUM_HOST": "nope"})):
        done = xum({**env, **extra}, *args, "ws", "ls")
        assert done.returncode == 1
        assert done.stderr.startswith("xum: error: no host 'nope' in ")
        assert str(hosts_path) in done.stderr and "xum host add nope" in done.stderr
        assert done.stderr.count("\n") == 1


def test_cli_malformed_hosts_file_is_one_clear_line(hosts_path: Path) -> None:
    hosts_path.parent.mkdir(parents=True)
    hosts_path.write_text("[hosts.a\n")
    done = xum({"XUM_HOSTS_FILE": str(hosts_path)}, "--host", "a", "status")
    assert done.returncode == 1
    assert str(hosts_path) in done.stderr and "line 1" in done.stderr


def test_cli_local_only_commands_refuse_host(hosts_path: Path) -> None:
    env = {"XUM_HOSTS_FILE": str(hosts_path)}
    for args in (
        ["daemon", "run"],
        ["daemon", "install", "--dry-run"],
        ["socket"],
        ["ws", "open", "x"],
    ):
        done = xum(env, "--host", "h", *args)
        assert done.returncode == 2, args
        assert "acts on this machine" in done.stderr


def test_cli_ssh_that_cannot_run_is_one_clear_line(hosts_path: Path) -> None:
    env = {"XUM_HOSTS_FILE": str(hosts_path), "XUM_SSH": "/nonexistent/ssh -F x"}
    assert xum(env, "host", "add", "h", "alias").returncode == 0
    done = xum(env, "--host", "h", "ws", "ls")
    assert done.returncode == 1
    assert done.stderr == (
        "xum: error: cannot run ssh (/nonexistent/ssh) for host 'h': No such file or directory\n"
    )


def test_cli_xum_ssh_that_cannot_be_split_is_one_clear_line(hosts_path: Path) -> None:
    env = {"XUM_HOSTS_FILE": str(hosts_path), "XUM_SSH": "ssh -F '/tmp/my config"}
    assert xum(env, "host", "add", "h", "alias").returncode == 0
    done = xum(env, "--host", "h", "ws", "ls")
    assert done.returncode == 1
    assert done.stderr == (
        'xum: error: cannot split $XUM_SSH "ssh -F \'/tmp/my config": No closing quotation\n'
    )


ADDER = """
import sys
from xum_client.hosts import HostEntry, add_host
for i in range(int(sys.argv[2])):
    add_host(HostEntry(f"{sys.argv[1]}{i}", "alias"))
"""


def test_concurrent_adds_all_land(hosts_path: Path) -> None:
    """Two writers adding at once: each read-modify-write holds the file's lock, so neither
    add is lost (the rename alone keeps the file whole, not both changes)."""
    procs = [
        subprocess.Popen([sys.executable, "-c", ADDER, prefix, "15"], env=os.environ.copy())
        for prefix in ("a", "b")
    ]
    for proc in procs:
        assert proc.wait(120) == 0
    names = set(hosts.load_hosts())
    assert names == {f"{p}{i}" for p in ("a", "b") for i in range(15)}


def test_a_held_lock_is_a_clear_error_after_its_deadline(
    hosts_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    hosts_path.parent.mkdir(parents=True)
    fd = os.open(hosts_path.parent / ".hosts.toml.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    monkeypatch.setattr(hosts, "LOCK_TIMEOUT_S", 0.2)
    try:
        with pytest.raises(HostConfigError, match="is locked by another xum for over"):
            hosts.add_host(HostEntry("a", "alias"))
    finally:
        os.close(fd)
    hosts.add_host(HostEntry("a", "alias"))
    assert list(hosts.load_hosts()) == ["a"]


def test_a_stream_cut_mid_message_is_a_lost_connection(tmp_short: Path) -> None:
    """The end of the stream in the middle of an answer (a connection cut while the daemon
    wrote) is ConnectionLost as a dropped connection, not "invalid JSON from the daemon": through
    a host it then says the outcome is unknown. The peer is a scripted socket (the fault)."""
    import socket
    import threading

    from xum_client import Client, ConnectionLost

    path = tmp_short / "s.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.makefile("rb").readline()
            conn.sendall(b'{"jsonrpc":"2.0","id":1,"result":{"pid')

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with pytest.raises(ConnectionLost, match="ended in the middle of a message"):
            Client(socket_path=path, timeout=10)
    finally:
        thread.join(10)
        server.close()


def test_how_to_look_names_what_the_lost_call_touched() -> None:
    from xum_client.sshlink import how_to_look

    assert how_to_look("h", "workspace.archive", {"workspace_id": "ws_1"}) == (
        "xum --host h ws show ws_1"
    )
    assert how_to_look("h", "workspace.create", {"project_id": "prj_1", "name": "a b"}) == (
        "xum --host h ws show 'prj_1/a b'"
    )
    assert how_to_look("h", "project.add", {"path": "/x"}) == "xum --host h project ls"
    assert how_to_look("h", "daemon.status", None) == "xum --host h ws ls"


def test_cli_project_add_through_a_host_takes_absolute_paths(hosts_path: Path) -> None:
    """With --host, PATH is the host's: a relative one is refused before connecting (usage)."""
    env = {"XUM_HOSTS_FILE": str(hosts_path)}
    for args in (["rel/repo"], ["/abs/repo", "--workspaces-dir", "rel"]):
        done = xum(env, "--host", "h", "project", "add", *args)
        assert done.returncode == 2, done.stderr
        assert "are paths on host h: give them absolute" in done.stderr


def test_a_symlinked_hosts_file_stays_a_link(hosts_path: Path, tmp_short: Path) -> None:
    """A dotfiles manager links the hosts file: a write replaces the target, not the link."""
    target = tmp_short / "dotfiles" / "hosts.toml"
    target.parent.mkdir()
    target.write_text('[hosts.a]\ndest = "x"\n')
    hosts_path.parent.mkdir(parents=True)
    hosts_path.symlink_to(target)
    hosts.add_host(HostEntry("b", "y"))
    assert hosts_path.is_symlink()
    assert set(hosts.load_hosts()) == {"a", "b"}
    assert "[hosts.b]" in target.read_text()
