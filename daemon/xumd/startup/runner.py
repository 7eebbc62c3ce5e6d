"""Start-up and exit of one daemon process: root lock, store, socket, serve, clean exit."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
from xum_protocol.discovery import default_root, resolve_socket

from xumd.app import App
from xumd.base import faults, logs
from xumd.base.config import ConfigError, load
from xumd.base.paths import RootPaths
from xumd.rpc.server import (
    SocketSetupError,
    bind_socket,
    launchd_socket,
    socket_name,
    systemd_socket,
)
from xumd.startup.composition import install_features
from xumd.store import Store, StoreError
from xumd.system import containment, fdlimits, platform, procstat
from xumd.system.rootlock import RootLockedError, acquire
from xumd.system.sdnotify import Notifier

log = logs.get("xumd.startup.main")

EXIT_FAILED = 1
EXIT_ALREADY_RUNNING = 3
EXIT_SETUP = 4

BOOT_ANCHOR = "boot-anchor"
"""ROOT/boot-anchor: "<boot id> <boot time>", fixed at the first start in a boot, so recorded
process start times mean the same after a wall-clock step and a restart (procstat)."""


def _fail(code: int, message: str) -> int:
    sys.stderr.write(f"xumd: {message}\n")
    log.error("daemon.start_failed", reason=message)
    return code


ROOT_FILES = frozenset(
    {
        "xumd.lock",
        "state.db",
        "config.toml",  # written before a first start
        "xumd.log",  # the bridge's log for the daemon it starts (xum_client.bridge)
        "xumd.sock",
        "boot-anchor",
        "workspaces",
        "trash",
        "archive",
        "processes",
    }
)
"""Entries that make a directory a root of xum's: a previous start, or a client that prepared
it for the first one."""


class RootRefused(OSError):
    """A root that is not made owner-only behind its users' backs."""


def prepare_root(root: Path) -> Path:
    root = root.expanduser().absolute()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    # The root holds the socket and every checkout's state: owner only. A directory that
    # others may enter and that holds other things (`--root /tmp`, `--root ~`, a project) is
    # not xum's to lock down: chmod would cut its other users off; refused instead.
    if os.stat(root).st_mode & 0o077:
        with os.scandir(root) as entries:
            names = {entry.name for entry in entries}
        if names and not names & ROOT_FILES:
            raise RootRefused(
                f"{root} holds other things and others may enter it; a root must be xum's own "
                "directory (an empty or new one, made owner-only at start)"
            )
    os.chmod(root, 0o700)
    return root


def run_daemon(
    root_arg: Path | None, socket_arg: Path | None, *, keep_processes: bool = False
) -> int:
    try:
        # First: every later step asks the system through it (XUM_PLATFORM may name none).
        platform.current()
    except platform.PlatformError as exc:
        return _fail(EXIT_SETUP, str(exc))
    try:
        root = prepare_root(root_arg or default_root())
    except OSError as exc:
        return _fail(EXIT_SETUP, f"cannot use root {root_arg or default_root()}: {exc}")
    paths = RootPaths(root)
    # The lock comes before anything else touches the root: state, socket, checkouts.
    try:
        lock = acquire(paths.lock)
    except RootLockedError as exc:
        return _fail(EXIT_ALREADY_RUNNING, str(exc))
    try:
        faults.arm_from_env()
        # Before anything records or compares a process identity (leases, adoption).
        procstat.anchor_boot(root / BOOT_ANCHOR)
        config = load(paths.config)
        if keep_processes:
            config.processes.keep_processes = True
        store = Store(paths.database)
        store.migrate()
    except (ValueError, ConfigError, StoreError) as exc:
        lock.release()
        return _fail(EXIT_SETUP, str(exc))

    # The clients' rule (xum_protocol.discovery): --socket, else --root's socket, else
    # XUM_SOCKET, else the root's (XUM_ROOT or the default, made absolute above).
    choice = resolve_socket(socket_arg, root_arg)
    socket_path = choice.path if choice.source in ("--socket", "XUM_SOCKET") else paths.socket
    owned_socket = False
    try:
        sock = systemd_socket() or launchd_socket()
        if sock is None:
            sock = bind_socket(socket_path)
            owned_socket = True
    except SocketSetupError as exc:
        store.close()
        lock.release()
        return _fail(EXIT_SETUP, str(exc))
    socket_ino = os.stat(socket_path).st_ino if owned_socket else None
    if not owned_socket:
        socket_path = Path(socket_name(sock))

    # Orphaned descendants of our children (a script's double fork) re-parent to us, not to
    # init: they stay findable, and we reap them (docs/PROCESSES.md, "Containment").
    containment.enable_subreaper()
    app = App(paths, config, store, Notifier())
    app.socket_path = socket_path
    install_features(app, lean=True)
    app.server.attach(sock)
    # Before serving: every later descriptor (git pipes, PTYs, clients) counts against it.
    app.server.limits = fdlimits.plan(config.max_connections, config.fd_reserve)
    log.info(
        "daemon.starting",
        root=str(root),
        socket=str(socket_path),
        activated=not owned_socket,
        pid=os.getpid(),
    )
    code = 0
    try:
        anyio.run(app.run)
    except Exception:
        # A startup step or the serving loop failed: logged, non-zero exit (systemd restarts).
        log.exception("daemon.failed")
        code = EXIT_FAILED
    finally:
        app.server.limits.close()
        if owned_socket:
            # Remove our socket only: never a file someone put there after us.
            try:
                if os.stat(socket_path).st_ino == socket_ino:
                    os.unlink(socket_path)
            except FileNotFoundError:
                pass
        store.close()
        lock.release()
    return code
