"""The Unix socket listener: bind (or adopt systemd's socket), check peers, one task per client."""

from __future__ import annotations

import os
import socket
import stat
import struct
from pathlib import Path

import anyio
from anyio.abc import SocketAttribute, SocketStream
from xum_protocol import framing
from xum_protocol.errors import ErrorKind

from xumd import logs
from xumd.config import DaemonConfig
from xumd.paths import socket_path_problem
from xumd.rpc.connection import Connection
from xumd.rpc.dispatch import Router, error_response

log = logs.get("xumd.server")

SD_LISTEN_FDS_START = 3


class SocketSetupError(Exception):
    pass


def systemd_socket() -> socket.socket | None:
    """The listening socket systemd passed (LISTEN_FDS/LISTEN_PID), if it is for us."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    try:
        count = int(os.environ.get("LISTEN_FDS", "0"))
    except ValueError:
        return None
    if count < 1:
        return None
    # Do not pass these on to children.
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)
    sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise SocketSetupError("systemd passed a socket that is not a Unix stream socket")
    os.set_inheritable(sock.fileno(), False)
    return sock


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
        path.unlink()  # stale: its daemon is gone, since we hold the root lock
        log.info("server.stale_socket_replaced", path=str(path))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the file is born 0600: no window where others may connect
    try:
        sock.bind(os.fsencode(path))
    except OSError as exc:
        sock.close()
        raise SocketSetupError(f"cannot bind {path}: {exc.strerror}") from exc
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(128)
    return sock


def peer_credentials(sock: socket.socket) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of the peer, from SO_PEERCRED (Linux)."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


class Server:
    def __init__(self, router: Router, config: DaemonConfig) -> None:
        self._router = router
        self._config = config
        self.connections: set[Connection] = set()
        self._sock: socket.socket | None = None

    def attach(self, sock: socket.socket) -> None:
        self._sock = sock

    async def serve(self, conn_tg: anyio.abc.TaskGroup, work_tg: anyio.abc.TaskGroup) -> None:
        """Accept until cancelled. Connections live in conn_tg, requests in work_tg."""
        if self._sock is None:
            raise RuntimeError("Server.serve() before attach()")
        listener = await anyio.abc.SocketListener.from_socket(self._sock)
        async with listener:
            while True:
                stream = await listener.accept()
                conn_tg.start_soon(self._serve_one, stream, work_tg)

    async def _serve_one(self, stream: SocketStream, work_tg: anyio.abc.TaskGroup) -> None:
        raw: socket.socket = stream.extra(SocketAttribute.raw_socket)
        creds = peer_credentials(raw)
        pid, uid = (creds[0], creds[1]) if creds else (None, None)
        if uid is not None and uid != os.getuid():
            log.warning("server.peer_refused", peer_uid=uid, peer_pid=pid)
            with anyio.move_on_after(1):
                await stream.send(
                    framing.encode(
                        error_response(
                            None,
                            ErrorKind.PERMISSION_DENIED,
                            f"permission denied: this daemon serves uid {os.getuid()} only",
                        )
                    )
                )
            await stream.aclose()
            return
        conn = Connection(
            stream,
            self._router,
            pid=pid,
            uid=uid,
            max_frame=self._config.max_frame_bytes,
            max_inflight=self._config.max_inflight_per_connection,
            queue_size=self._config.write_queue_messages,
            work=work_tg,
        )
        self.connections.add(conn)
        log.debug("server.connected", conn=conn.id, peer_pid=pid)
        try:
            await conn.serve()
        finally:
            self.connections.discard(conn)
            log.debug("server.disconnected", conn=conn.id)
