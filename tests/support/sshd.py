"""A real OpenSSH server on loopback for the hosts tests (docs/HOSTS.md, "Tests").

`SshServer(base).start()` makes a throwaway host key and client key under `base` (a short temp
directory), writes an `sshd_config` (127.0.0.1 only, keys from `base/authorized_keys`, no PAM, no
passwords, `StrictModes no`, `PidFile none`) and runs `sshd -D -e -f CONFIG -p PORT` on a free
port; it is ready when sshd logs `Server listening on 127.0.0.1 port PORT` (an event, waited for
with a deadline). `ssh_config` holds the client side, used as `XUM_SSH="ssh -F <ssh_config>"`
(`env()`), so the user's own ~/.ssh is never read or written:

- `xumtest1`: this server, the authorized key;
- `xumtest1-badkey`: this server, a key it does not know (refused);
- `xumtest-down`: a loopback port nothing listens on (unreachable).

The remote side is this machine, as the current user. The session's environment comes from
sshd's `SetEnv` (which beats anything a client sends): `PATH` starts with this test run's venv, so
the remote `xum` is the worktree's (`path_head=[]` gives a host without xum), and
`XDG_DATA_HOME`, `XDG_STATE_HOME` and `XDG_CONFIG_HOME` point into `base`, so neither a venv
installed under the real data directory nor the real default root is used. Tests give each host
entry a `--remote-root` under their temp directory.

Without sshd (or ssh, or ssh-keygen), or when not root (sshd's privilege separation needs
/run/sshd and root), `require_sshd()` skips the test saying why; `.ci/run` installs
openssh-server and openssh-client.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.wait import until

SSHD = "/usr/sbin/sshd"
ALIAS = "xumtest1"
ALIAS_BADKEY = "xumtest1-badkey"
ALIAS_DOWN = "xumtest-down"


def sshd_missing() -> str | None:
    """Why sshd cannot run here, or None."""
    if not os.path.exists(SSHD):
        return f"{SSHD} not found (apt-get install openssh-server)"
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install openssh-client)"
    if os.geteuid() != 0:
        return "sshd's privilege separation needs root"
    try:
        # sshd refuses to start without its privilege separation directory; a container where
        # systemd never ran has none.
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    except OSError as exc:
        return f"cannot make /run/sshd: {exc}"
    return None


def require_sshd() -> None:
    reason = sshd_missing()
    if reason is not None:
        pytest.skip(reason)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def keygen(path: Path) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "xum-test", "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return path


class SshServer:
    def __init__(
        self,
        base: Path,
        *,
        path_head: list[str] | None = None,
        set_env: dict[str, str] | None = None,
        authorized_from: SshServer | None = None,
        extra_config: str = "",
    ) -> None:
        """`authorized_from`: also accept that server's client key (so one ssh_config reaches
        both: an entry's `Port` option picks this one)."""
        self.base = base
        self.authorized_from = authorized_from
        self.extra_config = extra_config
        """Lines appended to sshd_config (e.g. a `ForceCommand`)."""
        # The venv's bin first: the remote `xum` is this worktree's.
        self.path_head = [str(Path(sys.executable).parent)] if path_head is None else path_head
        self.set_env = set_env or {}
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = base / "sshd.log"
        self.ssh_config = base / "ssh_config"
        self.data_home = base / "data"
        self.state_home = base / "state"
        self.config_home = base / "config"

    def session_env(self) -> dict[str, str]:
        env = {
            "PATH": ":".join([*self.path_head, "/usr/local/bin", "/usr/bin", "/bin"]),
            "XDG_DATA_HOME": str(self.data_home),
            "XDG_STATE_HOME": str(self.state_home),
            "XDG_CONFIG_HOME": str(self.config_home),
        }
        env.update(self.set_env)
        return env

    def _write_configs(self) -> None:
        b = self.base
        host_key = keygen(b / "host_ed25519")
        key = keygen(b / "id_ed25519")
        keygen(b / "id_unknown")
        keys = (b / "id_ed25519.pub").read_text()
        if self.authorized_from is not None:
            keys += (self.authorized_from.base / "id_ed25519.pub").read_text()
        (b / "authorized_keys").write_text(keys)
        for d in (self.data_home, self.state_home, self.config_home):
            d.mkdir(parents=True, exist_ok=True)
        set_env = " ".join(f"{k}={v}" for k, v in self.session_env().items())
        user = getpass.getuser()
        (b / "sshd_config").write_text(
            f"ListenAddress 127.0.0.1\n"
            f"HostKey {host_key}\n"
            "PidFile none\n"
            "UsePAM no\n"
            "StrictModes no\n"
            f"AuthorizedKeysFile {b / 'authorized_keys'}\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\n"
            f"AllowUsers {user}\n"
            "PrintMotd no\n"
            "LogLevel INFO\n"
            f"SetEnv {set_env}\n"
            f"{self.extra_config}"
        )
        common = (
            f"  User {user}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {b / 'known_hosts'}\n"
            "  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking accept-new\n"
            "  PasswordAuthentication no\n"
            "  KbdInteractiveAuthentication no\n"
            "  ControlMaster no\n"
            "  ControlPath none\n"
            "  ConnectTimeout 10\n"
            "  LogLevel ERROR\n"
            # The cheapest key exchange ssh offers (the default adds a post-quantum part):
            # every test connection pays for it on shared cores.
            "  KexAlgorithms curve25519-sha256\n"
        )
        self.ssh_config.write_text(
            f"Host {ALIAS}\n  HostName 127.0.0.1\n  Port {self.port}\n"
            f"  IdentityFile {key}\n{common}\n"
            f"Host {ALIAS_BADKEY}\n  HostName 127.0.0.1\n  Port {self.port}\n"
            f"  IdentityFile {b / 'id_unknown'}\n{common}\n"
            f"Host {ALIAS_DOWN}\n  HostName 127.0.0.1\n  Port {free_port()}\n"
            f"  IdentityFile {key}\n{common}"
        )

    def start(self, timeout: float = 20.0) -> SshServer:
        require_sshd()
        self.port = free_port()
        self._write_configs()
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.base / "sshd_config"), "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        ready = f"Server listening on 127.0.0.1 port {self.port}"

        def listening() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"sshd exited with {self.proc.returncode}: {self.log_path.read_text()[-2000:]}"
                )
            return ready in self.log_path.read_text(errors="replace")

        until(listening, timeout, message=f"sshd listening on port {self.port}")
        return self

    def env(self) -> dict[str, str]:
        """The client side's environment: ssh with this server's ssh_config."""
        return {"XUM_SSH": f"ssh -F {self.ssh_config}"}

    def close(self) -> None:
        # A bridge without --root started its daemon on the sessions' default root.
        stop_root_daemon(self.state_home / "xum")
        if self.proc is not None and self.proc.poll() is None:
            # Its own session: the listener and any session it still serves.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def stop_root_daemon(root: Path, timeout: float = 20.0) -> None:
    """Stop the daemon a bridge started on `root` (if any), and wait until it has exited.

    Asked to shut down first; one that does not exit in time is killed by pid, after checking
    that pid is still the lock holder (pid and start time, from the lock file)."""
    import psutil

    from tests.support.lockholder import read_holder

    lock = root / "xumd.lock"
    holder = read_holder(lock)
    if holder is None:
        return
    from xum_client import Client, XumClientError

    with contextlib.suppress(XumClientError, OSError), Client(root, timeout=10) as client:
        client.call("daemon.shutdown")
    deadline = time.monotonic() + timeout
    while read_holder(lock) is not None:
        if time.monotonic() > deadline:
            pid, started = holder.get("pid"), holder.get("process_start_time")
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).create_time() == started:
                    os.kill(pid, signal.SIGKILL)
            until(lambda: read_holder(lock) is None, 10, message=f"daemon on {root} gone")
            return
        time.sleep(0.02)
