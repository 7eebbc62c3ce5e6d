"""`xum bridge`: relay stdin/stdout to the daemon's socket, starting the daemon when none runs.

A client on another machine runs `ssh HOST xum bridge` and speaks the ordinary NDJSON JSON-RPC
over ssh's pipes (docs/HOSTS.md). The bridge adds nothing to the bytes: what comes in on stdin
goes to the socket and what the daemon writes goes to stdout, each direction in its own thread so
that neither can hold the other up (a client that pipelines requests while the daemon answers
would otherwise deadlock a single loop blocked in one write).

Ends: stdin's end is passed on as a half-close of the socket (the daemon then answers what it
has and ends the connection, as for any client that half-closes); the socket's end closes
stdout and the bridge exits; a reader of stdout that goes away (ssh dropped) ends the bridge at
once, which closes the connection, so the daemon sees the client leave.

Starting: when nothing answers on the socket, the bridge starts `xumd` for that root detached (a
session of its own, in `/`, stdin from /dev/null, stdout and stderr appended to `ROOT/xumd.log`,
without the ssh session's variables: `SESSION_VARIABLES`), then
waits, with a deadline, until the socket accepts. The root lock keeps the daemon single: two
bridges racing both start one, the second exits 3 (`already running`) and its bridge connects to
the first. A systemd socket unit (`xum daemon install`) needs nothing here: its socket accepts,
and systemd starts the daemon.

Light (stdlib only), like the rest of the CLI's start-up path.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from xum_protocol import discovery

START_TIMEOUT_S = 30.0
"""How long a started daemon may take to accept on its socket (recovery runs before that)."""
POLL_S = 0.02
CHUNK = 65536
EXIT_ALREADY_RUNNING = 3
"""xumd's status when another daemon holds the root (`xumd.startup.runner`)."""
LOG_NAME = "xumd.log"


class BridgeError(Exception):
    """Why the bridge cannot relay (one line, printed as `xum bridge: ...`)."""


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except BaseException:
        sock.close()
        raise
    return sock


def _try_connect(path: Path) -> socket.socket | None:
    """A connection, None when no daemon listens there, BridgeError for anything else."""
    try:
        return _connect(path)
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
        # No socket, a stale one, or no root yet (a file in its way is reported when the
        # daemon's root is made).
        return None
    except PermissionError:
        raise BridgeError(
            f"permission denied on {path}: the daemon there belongs to another user"
        ) from None
    except OSError as exc:
        raise BridgeError(f"cannot connect to {path}: {exc.strerror or exc}") from None


def _log_tail(log_path: Path) -> str:
    """The daemon's last own line in its log (`xumd: ...`), else its last line."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()[-50:]
    except OSError:
        return ""
    for line in reversed(lines):
        if line.startswith("xumd: "):
            return line[len("xumd: ") :]
    return lines[-1] if lines else ""


SESSION_VARIABLES = (
    "SSH_AUTH_SOCK",
    "SSH_CLIENT",
    "SSH_CONNECTION",
    "SSH_ORIGINAL_COMMAND",
    "SSH_TTY",
    "XUM_HOST",
)
"""What describes the ssh session the bridge runs in, not the daemon: the daemon outlives the
session and hands its environment to scripts and agents, which must not get a forwarded agent's
socket (gone with the session, and a credential besides) or the client's address."""


def daemon_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a daemon the bridge starts: its own, less the session's."""
    return {k: v for k, v in env.items() if k not in SESSION_VARIABLES}


def start_daemon(
    root: Path, root_arg: str | None, socket_arg: str | None
) -> subprocess.Popen[bytes]:
    """Start `xumd` for `root`, detached; its output goes to ROOT/xumd.log."""
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        log_fd = os.open(root / LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError as exc:
        raise BridgeError(f"cannot prepare root {root}: {exc.strerror or exc}") from None
    argv = [sys.executable, "-m", "xumd"]
    # Absolute: the daemon runs from / (it must not keep the session's directory busy).
    if root_arg:
        argv += ["--root", os.path.abspath(root_arg)]
    if socket_arg:
        argv += ["--socket", os.path.abspath(socket_arg)]
    try:
        # Its own session: the ssh session ending (SIGHUP to its group) must not end the
        # daemon, and it must not hold the ssh channel open through inherited descriptors.
        return subprocess.Popen(  # noqa: S603 - this installation's xumd, argv, no shell
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
            close_fds=True,
            cwd="/",
            env=daemon_env(os.environ),
        )
    except OSError as exc:
        raise BridgeError(f"cannot start xumd ({argv[0]}): {exc.strerror or exc}") from None
    finally:
        os.close(log_fd)


def connect_or_start(
    root_arg: str | None, socket_arg: str | None, timeout: float = START_TIMEOUT_S
) -> socket.socket:
    """A connection to the daemon of that root (by the discovery rule), started if needed."""
    choice = discovery.resolve_socket(socket_arg, root_arg)
    sock = _try_connect(choice.path)
    if sock is not None:
        return sock
    root = choice.root or discovery.default_root()
    log_path = root / LOG_NAME
    proc = start_daemon(root, str(choice.root) if root_arg else None, socket_arg)
    deadline = time.monotonic() + timeout
    while True:
        sock = _try_connect(choice.path)
        if sock is not None:
            # Reaped when it exits (a loser of a race exits 3 at once; the winner outlives
            # the bridge and is then re-parented): no zombie while the bridge relays.
            threading.Thread(target=proc.wait, name="xumd-reaper", daemon=True).start()
            return sock
        code = proc.poll()
        # Status 3: another daemon holds the root (a racing bridge started it first): wait for
        # that one's socket. Anything else: it failed, and its log says why.
        if code is not None and code != EXIT_ALREADY_RUNNING:
            raise BridgeError(
                f"xumd exited with status {code} before accepting on {choice.path}: "
                f"{_log_tail(log_path) or 'no output'} (log: {log_path})"
            )
        if time.monotonic() > deadline:
            raise BridgeError(
                f"xumd did not accept on {choice.path} within {timeout:.0f}s "
                f"(log: {log_path}: {_log_tail(log_path) or 'no output'})"
            )
        time.sleep(POLL_S)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def relay(sock: socket.socket, stdin_fd: int = 0, stdout_fd: int = 1) -> int:
    """Relay until the daemon ends the connection or the reader of stdout goes away."""
    wake_r, wake_w = os.pipe()
    done = threading.Event()

    def finish() -> None:
        done.set()
        try:
            os.write(wake_w, b"x")
        except OSError:
            pass

    def inbound() -> None:
        # stdin -> socket; stdin's end becomes the socket's half-close.
        try:
            while True:
                data = os.read(stdin_fd, CHUNK)
                if not data:
                    break
                sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            # The daemon went away: the other direction sees the socket's end and finishes.
            pass

    def outbound() -> None:
        # socket -> stdout; the socket's end (or stdout's) ends the bridge.
        try:
            while True:
                data = sock.recv(CHUNK)
                if not data:
                    break
                _write_all(stdout_fd, data)
        except OSError:
            pass
        finally:
            finish()

    threading.Thread(target=inbound, name="bridge-in", daemon=True).start()
    threading.Thread(target=outbound, name="bridge-out", daemon=True).start()
    # Watch stdout for its reader going away (ssh dropped): a pipe or socket reports it as
    # POLLERR/POLLHUP with no events asked. A subscriber's connection otherwise stays open
    # until the next event fails to be written.
    poller = select.poll()
    poller.register(wake_r, select.POLLIN)
    poller.register(stdout_fd, 0)
    while not done.is_set():
        for fd, _events in poller.poll():
            if fd == stdout_fd:
                done.set()
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
    os.close(wake_r)
    os.close(wake_w)
    return 0


def run(root_arg: str | None, socket_arg: str | None, timeout: float = START_TIMEOUT_S) -> int:
    """The `xum bridge` command: 0 after a relay that ended, 1 with one line on stderr."""
    try:
        sock = connect_or_start(root_arg, socket_arg, timeout)
    except BridgeError as exc:
        sys.stderr.write(f"xum bridge: {exc}\n")
        sys.stderr.flush()
        return 1
    return relay(sock)
