"""The `xum` CLI: status, daemon run|stop|status|install, --json everywhere, exit codes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import click
import pytest
from xum_client import cli as cli_module
from xum_client.errors import NotFound

from tests.support.daemon import DaemonProcess
from tests.support.wait import until


def xum(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "xum"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_no_daemon_is_exit_4_with_a_clear_message(root: Path) -> None:
    done = xum("--root", str(root), "status")
    assert done.returncode == 4
    assert f"no daemon on {root}; start it with `xum daemon run` or the systemd unit" in (
        done.stderr
    )


def test_status_for_people_and_for_scripts(daemon: DaemonProcess) -> None:
    human = xum("--root", str(daemon.root), "status")
    assert human.returncode == 0, human.stderr
    assert f"pid:         {daemon.pid}\n" in human.stdout
    assert "serving" in human.stdout
    status = daemon.call("daemon.status")["details"]["fds"]
    assert f"limit {status['soft']} (hard {status['hard']})" in human.stdout
    for args in (("--json", "status"), ("status", "--json")):
        done = xum("--root", str(daemon.root), *args)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["pid"] == daemon.pid


def test_root_from_the_environment(daemon: DaemonProcess) -> None:
    done = xum("status", "--json", env={"XUM_ROOT": str(daemon.root)})
    assert json.loads(done.stdout)["root"] == str(daemon.root)


def test_daemon_status_and_stop(daemon: DaemonProcess) -> None:
    running = xum("--root", str(daemon.root), "daemon", "status", "--json")
    assert running.returncode == 0
    assert json.loads(running.stdout)["running"] is True
    stopped = xum("--root", str(daemon.root), "daemon", "stop", "--json")
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout) == {
        "stopped": True,
        "pid": daemon.pid,
        "root": str(daemon.root),
    }
    assert daemon.wait(10) == 0  # the lock is released last: the exit follows at once
    gone = xum("--root", str(daemon.root), "daemon", "status", "--json")
    assert gone.returncode == 4
    assert json.loads(gone.stdout)["running"] is False
    assert xum("--root", str(daemon.root), "daemon", "stop").returncode == 4


def test_daemon_stop_by_socket_waits_on_that_daemons_root(
    daemon: DaemonProcess, tmp_short: Path
) -> None:
    # Named by its socket only, with nothing at the default root: the wait for the exit is on
    # the lock of the daemon that was asked to stop (its root), not on the default root's,
    # which is free at once and would report "stopped" while the daemon still drains.
    env = {k: v for k, v in os.environ.items() if not k.startswith("XUM_")}
    env["XDG_STATE_HOME"] = str(tmp_short / "state")
    socket_option = ["--socket", str(daemon.socket_path)]
    stopped = subprocess.run(
        [str(Path(sys.executable).parent / "xum"), *socket_option, "--json", "daemon", "stop"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout) == {
        "stopped": True,
        "pid": daemon.pid,
        "root": str(daemon.root),
    }
    assert cli_module.lock_holder(str(daemon.root)) is None
    assert daemon.wait(10) == 0


def test_daemon_run_serves_in_the_foreground(root: Path) -> None:
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "xum"), "--root", str(root), "daemon", "run"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def answers() -> dict[str, object] | None:
            done = xum("--root", str(root), "status", "--json")
            return json.loads(done.stdout) if done.returncode == 0 else None

        status = until(answers, message="xum daemon run to serve")
        assert status["pid"] == proc.pid  # exec: the CLI process became the daemon
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_not_found_is_exit_3_and_other_errors_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    @click.command("raise-not-found")
    def raise_not_found() -> None:
        raise NotFound(-32001, "workspace 'ws_0' not found", {"kind": "not_found"})

    @click.command("raise-busy")
    def raise_busy() -> None:
        from xum_client.errors import Busy

        raise Busy(-32002, "busy", {"kind": "busy"})

    monkeypatch.setitem(cli_module.cli.commands, "raise-not-found", raise_not_found)
    monkeypatch.setitem(cli_module.cli.commands, "raise-busy", raise_busy)
    with pytest.raises(SystemExit) as caught:
        cli_module.main(["raise-not-found"])
    assert caught.value.code == cli_module.EXIT_NOT_FOUND
    with pytest.raises(SystemExit) as caught:
        cli_module.main(["raise-busy"])
    assert caught.value.code == cli_module.EXIT_ERROR
    with pytest.raises(SystemExit) as caught:
        cli_module.main(["no-such-command"])
    assert caught.value.code == 2


def test_every_command_accepts_json() -> None:
    group = cli_module.cli
    ctx = click.Context(group)
    names = group.list_commands(ctx)
    assert {"status", "daemon"} <= set(names)

    def check(command: click.Command, path: str) -> None:
        assert any("--json" in getattr(p, "opts", ()) for p in command.params), path
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                check(sub, f"{path} {name}")

    for name in names:
        command = group.get_command(ctx, name)
        assert command is not None
        check(command, name)


def test_start_up_imports_stay_light() -> None:
    # What `xum status` imports before it talks to the daemon: no rich, no pydantic, no anyio,
    # and no domain command modules.
    code = (
        "import sys\n"
        "from xum_client import cli\n"
        "ctx = cli.click.Context(cli.cli)\n"
        "cli.cli.get_command(ctx, 'status')\n"
        "heavy = [m for m in ('rich', 'pydantic', 'anyio', 'xum_client.commands.workspace')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == ""


def test_daemon_install_writes_user_units(tmp_short: Path) -> None:
    home = tmp_short / "home"
    home.mkdir()
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    dry = xum("daemon", "install", "--dry-run", "--json", env=env)
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert not (home / ".config").exists()
    done = xum("daemon", "install", env=env)
    assert done.returncode == 0, done.stderr
    assert "systemctl --user enable --now xumd.socket" in done.stdout
    unit_dir = home / ".config" / "systemd" / "user"
    service = (unit_dir / "xumd.service").read_text()
    xumd = str(Path(sys.executable).parent / "xumd")
    assert f"ExecStart={xumd} --root %S/xum" in service
    assert (unit_dir / "xumd.socket").read_text() == plan["files"][str(unit_dir / "xumd.socket")]
    if shutil.which("systemd-analyze"):
        runtime = tmp_short / "run"
        runtime.mkdir(mode=0o700)
        verify = subprocess.run(
            [
                "systemd-analyze",
                "--user",
                "verify",
                str(unit_dir / "xumd.service"),
                str(unit_dir / "xumd.socket"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **env, "XDG_RUNTIME_DIR": str(runtime)},
        )
        assert verify.returncode == 0 and verify.stderr == "", verify.stderr


def test_daemon_install_with_a_root(tmp_short: Path) -> None:
    home = tmp_short / "home"
    home.mkdir()
    root = tmp_short / "r%oot"
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    done = xum("--root", str(root), "daemon", "install", env=env)
    assert done.returncode == 0, done.stderr
    unit_dir = home / ".config" / "systemd" / "user"
    literal = str(root).replace("%", "%%")
    assert f"--root {literal}\n" in (unit_dir / "xumd.service").read_text()
    assert f"ListenStream={literal}/xumd.sock\n" in (unit_dir / "xumd.socket").read_text()


def test_python_m_xum_client_cli_runs_the_command_line() -> None:
    # It exited 0 doing nothing: a silent success for whatever was asked.
    done = subprocess.run(
        [sys.executable, "-m", "xum_client.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.startswith("xum, version "), done


def test_daemon_status_of_a_root_held_but_not_answering_is_exit_1_naming_the_holder(
    root: Path,
) -> None:
    # A daemon starting up, or stuck: it holds the root's lock (a real flock, with the pid
    # inside as xumd writes it) and nothing answers on the socket.
    import fcntl

    root.mkdir(parents=True)
    fd = os.open(root / "xumd.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, json.dumps({"pid": os.getpid()}).encode())
        as_json = xum("--root", str(root), "daemon", "status", "--json")
        assert as_json.returncode == 1, as_json.stderr
        info = json.loads(as_json.stdout)
        assert (info["running"], info["answering"], info["pid"]) == (True, False, os.getpid())
        text = xum("--root", str(root), "daemon", "status")
        assert text.returncode == 1
        assert f"xumd pid {os.getpid()} holds {root} but does not answer" in text.stdout
    finally:
        os.close(fd)
    # Released: no daemon at all.
    assert xum("--root", str(root), "daemon", "status").returncode == 4
