"""The Unix socket listener: bind (or adopt systemd's socket), check peers, one task per client."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
from xum_protocol import framing
from xum_protocol.errors import ErrorKind

from xumd.base import logs
from xumd.base.config import DaemonConfig
from xumd.base.paths import socket_path_problem
from xumd.rpc.connection import Connection
from xumd.rpc.dispatch import Router, error_response
from xumd.rpc.transport import FrameProtocol
from xumd.system import diskfull
from xumd.system.fdlimits import FdLimits, is_exhausted
from xumd.system.platform import current

if TYPE_CHECKING:
    import ctypes

log = logs.get("xumd.server")

SD_LISTEN_FDS_START = 3


class SocketSetupError(Exception):
    pass


def systemd_socket() -> socket.socket | None:
    """The listening socket systemd passed (LISTEN_FDS/LISTEN_PID), if it is for us.

    sd_listen_fds(3) semantics: the variables count only when LISTEN_PID is our pid; the first
    passed descriptor is fd 3; the variables are removed so children do not see them."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    try:
        count = int(os.environ.get("LISTEN_FDS", "0"))
    except ValueError:
        return None
    finally:
        for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            os.environ.pop(name, None)
    if count < 1:
        return None
    if count > 1:
        log.warning("server.extra_listen_fds", count=count, used=SD_LISTEN_FDS_START)
    try:
        sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    except OSError as exc:
        raise SocketSetupError(f"LISTEN_FDS is set but fd 3 is not a socket: {exc}") from exc
    return _passed_listener(sock, "systemd")


def _passed_listener(sock: socket.socket, manager: str) -> socket.socket:
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise SocketSetupError(f"{manager} passed a socket that is not a Unix stream socket")
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        raise SocketSetupError(f"{manager} passed a socket that is not listening")
    # Do not pass it on to children.
    os.set_inheritable(sock.fileno(), False)
    return sock


LAUNCHD_SOCKET = "Listeners"
"""The key of xumd's socket under `Sockets` in its launchd plist (`xum_client.units`)."""

ActivateSocket = Callable[
    [bytes, "ctypes._Pointer[ctypes._Pointer[ctypes.c_int]]", "ctypes._Pointer[ctypes.c_size_t]"],
    int,
]
"""launch_activate_socket(3)'s C signature: (name, &fds, &count) -> 0 or an errno value."""
Free = Callable[["ctypes._Pointer[ctypes.c_int]"], None]


def launchd_socket(
    activate: ActivateSocket | None = None, free: Free | None = None
) -> socket.socket | None:
    """The listening socket launchd made for `Sockets` in the plist, if launchd started us.

    macOS only (libSystem's launch_activate_socket); elsewhere, or when xumd was not started by
    launchd (ESRCH) or its plist has no such socket (ENOENT), None: xumd binds its own. Tests
    pass a stand-in with the same C signature, since launchd cannot run on Linux."""
    if activate is None or free is None:
        functions = current().launchd_functions()
        if functions is None:
            return None
        activate, free = functions
    import ctypes  # here: a daemon started elsewhere never loads it

    fds = ctypes.POINTER(ctypes.c_int)()
    count = ctypes.c_size_t(0)
    err = activate(LAUNCHD_SOCKET.encode(), ctypes.pointer(fds), ctypes.pointer(count))
    if err in (errno.ESRCH, errno.ENOENT):
        return None
    if err:
        raise SocketSetupError(f"launch_activate_socket: {os.strerror(err)}")
    try:
        passed = [fds[i] for i in range(count.value)]
    finally:
        free(fds)  # the caller owns the array (launch(3))
    if not passed:
        raise SocketSetupError("launchd passed no socket for " + LAUNCHD_SOCKET)
    for extra in passed[1:]:
        os.close(extra)
    if len(passed) > 1:
        log.warning("server.extra_launchd_fds", count=len(passed))
    return _passed_listener(socket.socket(fileno=passed[0]), "launchd")


def socket_name(sock: socket.socket) -> str:
    name = sock.getsockname()
    return os.fsdecode(name) if isinstance(name, bytes | str) else str(name)


def bind_socket(path: Path) -> socket.socket:
    """Bind a fresh listening socket at `path` (mode 0600). Call only while holding the root lock:
    that is what makes unlinking a stale socket file safe."""
    problem = socket_path_problem(path)
    if problem:
        raise SocketSetupError(problem)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(mode):
            raise SocketSetupError(f"{path} exists and is not a socket; refusing to replace it")
        if _has_listener(path):
            # Not a daemon of this root (we hold its lock): most likely the systemd socket
            # unit, which would be left listening on a path we had stolen.
            raise SocketSetupError(
                f"{path} is held by a listening socket that is not an xumd on this root (the "
                "systemd socket unit xumd.socket?); stop it (`systemctl --user stop xumd.socket`)"
                " or start xumd through it (`systemctl --user start xumd`), or use --socket"
            )
        path.unlink()  # stale: its daemon is gone, since we hold the root lock
        log.info("server.stale_socket_replaced", path=str(path))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the file is born 0600: no window where others may connect
    try:
        sock.bind(os.fsencode(path))
    except OSError as exc:
        sock.close()
        why = exc.strerror
        if diskfull.is_no_space_oserror(exc):
            # A socket file takes an inode: say which filesystem has none left.
            fs = diskfull.filesystem_of(path)
            why = f"{why}: {fs.describe()} is full{fs.free()}; free space or inodes there"
        raise SocketSetupError(f"cannot bind {path}: {why}") from exc
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    # A burst of clients (editor start-up, an orchestrator fanning out) must not see EAGAIN.
    sock.listen(socket.SOMAXCONN)
    return sock


def _has_listener(path: Path) -> bool:
    """Whether some process listens on the Unix socket bound at `path` (Linux: /proc/net/unix;
    elsewhere we cannot tell without connecting, which would trigger socket activation)."""
    return current().unix_listener(os.fsdecode(path))


def peer_credentials(sock: socket.socket) -> tuple[int | None, int, int] | None:
    """(pid, uid, gid) of the peer (the platform's: SO_PEERCRED, or LOCAL_PEERCRED and
    LOCAL_PEERPID on macOS); None where there is no way to ask."""
    return current().peer_credentials(sock)


ACCEPT_RETRY_S = 0.1
"""After an accept error (out of descriptors): pause, then accept again; never crash the loop."""
ACCEPT_RETRY_MAX_S = 2.0
REFUSAL_SEND_S = 1.0


class Server:
    def __init__(self, router: Router, config: DaemonConfig) -> None:
        self._router = router
        self._config = config
        self.connections: set[Connection] = set()
        self.serving = False
        self._sock: socket.socket | None = None
        # Sized at start (fdlimits.plan, after raising the soft limit); tests that build a
        # Server directly get the configured cap and no spare descriptor.
        self.limits: FdLimits | None = None
        self._open = 0  # accepted and not yet ended (a superset of `connections`)

    def attach(self, sock: socket.socket) -> None:
        self._sock = sock

    @property
    def max_connections(self) -> int:
        return self.limits.max_connections if self.limits else self._config.max_connections

    async def serve(self, conn_tg: anyio.abc.TaskGroup, work_tg: anyio.abc.TaskGroup) -> None:
        """Accept until cancelled. Connections live in conn_tg, requests in work_tg.

        The raw socket is accepted directly (not through anyio's listener, which turns EMFILE
        into a BrokenResourceError that ended the daemon): out of descriptors, the newest
        client is refused with the spare descriptor and the loop backs off, logging once per
        episode; it never exits while the daemon serves."""
        if self._sock is None:
            raise RuntimeError("Server.serve() before attach()")
        sock = self._sock
        sock.setblocking(False)
        self.serving = True
        backoff = ACCEPT_RETRY_S
        failing_since: int | None = None
        try:
            while True:
                await anyio.wait_readable(sock)
                try:
                    client, _addr = sock.accept()
                except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                    continue
                except OSError as exc:
                    if self.limits is not None:
                        self.limits.accept_failures += 1
                    if failing_since is None:
                        # Once per episode: a full backlog would otherwise log at 10 Hz.
                        failing_since = self.limits.accept_failures if self.limits else 0
                        log.error(
                            "server.accept_failed",
                            error=exc.strerror or str(exc),
                            errno=exc.errno,
                            connections=len(self.connections),
                        )
                    if is_exhausted(exc):
                        self._refuse_with_spare(sock)
                    await anyio.sleep(backoff)
                    backoff = min(backoff * 2, ACCEPT_RETRY_MAX_S)
                    continue
                if failing_since is not None:
                    log.info(
                        "server.accept_recovered",
                        failures=(self.limits.accept_failures - failing_since + 1)
                        if self.limits
                        else None,
                    )
                    failing_since = None
                    backoff = ACCEPT_RETRY_S
                # Counted at accept, not when the connection's task first runs: a burst
                # accepted before those tasks start must not overshoot the cap.
                if self._open >= self.max_connections:
                    conn_tg.start_soon(self._refuse, client)
                    continue
                self._open += 1
                conn_tg.start_soon(self._serve_counted, client, work_tg)
        finally:
            self.serving = False
            # Stop accepting means closed: new clients get ECONNREFUSED, not a backlog that
            # nobody reads.
            sock.close()

    def _refusal(self) -> bytes:
        return framing.encode(
            error_response(
                None,
                ErrorKind.BUSY,
                f"too many connections: this daemon serves at most {self.max_connections} at "
                "once (the rest of its file descriptors are kept for its own work); retry later",
                {"resource": "connections", "max_connections": self.max_connections},
            )
        )

    def _count_refusal(self, reason: str) -> None:
        if self.limits is not None:
            self.limits.refused += 1
            # The first and then every thousandth: a flood must not flood the log too.
            if self.limits.refused == 1 or self.limits.refused % 1000 == 0:
                log.warning(
                    "server.connection_refused",
                    reason=reason,
                    refused=self.limits.refused,
                    max_connections=self.max_connections,
                )

    async def _refuse(self, client: socket.socket) -> None:
        """The newest client over the cap: one clear error, then close (bounded)."""
        self._count_refusal("connection cap")
        client.setblocking(False)
        with client, anyio.move_on_after(REFUSAL_SEND_S):
            data = self._refusal()
            while data:
                try:
                    sent = client.send(data)
                except BlockingIOError:
                    await anyio.wait_writable(client)
                    continue
                except OSError:
                    return
                data = data[sent:]

    def _refuse_with_spare(self, sock: socket.socket) -> None:
        """Out of descriptors: give up the spare one to accept the newest client, tell it why
        (non-blocking: a refusal is one small frame), close it, take the spare back."""
        if self.limits is None:
            return
        with self.limits.spare_released():
            try:
                client, _addr = sock.accept()
            except OSError:
                return
            self._count_refusal("out of file descriptors")
            with client:
                client.setblocking(False)
                with contextlib.suppress(OSError):
                    client.send(
                        framing.encode(
                            error_response(
                                None,
                                ErrorKind.BUSY,
                                "the daemon is out of file descriptors; retry later",
                                {"resource": "file_descriptors"},
                            )
                        )
                    )

    async def _serve_counted(self, client: socket.socket, work_tg: anyio.abc.TaskGroup) -> None:
        try:
            await self._serve_one(client, work_tg)
        finally:
            self._open -= 1

    async def _serve_one(self, client: socket.socket, work_tg: anyio.abc.TaskGroup) -> None:
        try:
            creds = peer_credentials(client)
        except (OSError, ValueError) as exc:
            # A peer whose uid cannot be read is not served: closed, unanswered.
            log.warning("server.peer_unreadable", error=str(exc))
            client.close()
            return
        pid, uid = (creds[0], creds[1]) if creds else (None, None)
        max_frame = self._config.max_frame_bytes
        try:
            _transport, proto = await asyncio.get_running_loop().connect_accepted_socket(
                lambda: FrameProtocol(max_frame), client
            )
        except OSError as exc:
            log.error("server.stream_failed", error=str(exc))
            client.close()
            return
        if uid is not None and uid != os.getuid():
            log.warning("server.peer_refused", peer_uid=uid, peer_pid=pid)
            proto.stop()  # nothing it sends is read, let alone answered
            proto.write(
                framing.encode(
                    error_response(
                        None,
                        ErrorKind.PERMISSION_DENIED,
                        f"permission denied: this daemon serves uid {os.getuid()} only",
                    )
                )
            )
            await proto.close(linger=True)
            return
        conn = Connection(
            proto,
            self._router,
            pid=pid,
            uid=uid,
            max_frame=self._config.max_frame_bytes,
            max_inflight=self._config.max_inflight_per_connection,
            queue_size=self._config.write_queue_messages,
            queue_bytes=self._config.write_queue_bytes,
            max_batch=self._config.max_batch_items,
            work=work_tg,
        )
        self.connections.add(conn)
        log.debug("server.connected", conn=conn.id, peer_pid=pid)
        try:
            await conn.serve()
        except Exception:
            # One connection's failure is logged and ends that connection only.
            log.exception("server.connection_failed", conn=conn.id)
        finally:
            self.connections.discard(conn)
            log.debug("server.disconnected", conn=conn.id)
