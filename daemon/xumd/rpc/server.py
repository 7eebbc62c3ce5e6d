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

from xumd import diskfull, logs
from xumd.config import DaemonConfig
from xumd.paths import socket_path_problem
from xumd.rpc.connection import Connection, close_stream
from xumd.rpc.dispatch import Router, error_response

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
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise SocketSetupError("systemd passed a socket that is not a Unix stream socket")
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        raise SocketSetupError("systemd passed a socket that is not listening")
    # Do not pass it on to children.
    os.set_inheritable(sock.fileno(), False)
    return sock


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


_SO_ACCEPTCON = 0x00010000


def _has_listener(path: Path) -> bool:
    """Whether some process listens on the Unix socket bound at `path` (Linux: /proc/net/unix;
    elsewhere we cannot tell without connecting, which would trigger socket activation)."""
    target = os.fsdecode(path)
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as table:
            next(table, None)  # header
            for line in table:
                fields = line.split(None, 7)
                listening = len(fields) == 8 and int(fields[3], 16) & _SO_ACCEPTCON
                if listening and fields[7].rstrip("\n") == target:
                    return True
    except (OSError, ValueError):
        return False
    return False


def peer_credentials(sock: socket.socket) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of the peer, from SO_PEERCRED (Linux)."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


ACCEPT_RETRY_S = 0.1
"""After an accept error (out of descriptors): pause, then accept again; never crash the loop."""


class Server:
    def __init__(self, router: Router, config: DaemonConfig) -> None:
        self._router = router
        self._config = config
        self.connections: set[Connection] = set()
        self.serving = False
        self._sock: socket.socket | None = None

    def attach(self, sock: socket.socket) -> None:
        self._sock = sock

    async def serve(self, conn_tg: anyio.abc.TaskGroup, work_tg: anyio.abc.TaskGroup) -> None:
        """Accept until cancelled. Connections live in conn_tg, requests in work_tg."""
        if self._sock is None:
            raise RuntimeError("Server.serve() before attach()")
        listener = await anyio.abc.SocketListener.from_socket(self._sock)
        async with listener:
            self.serving = True
            try:
                while True:
                    try:
                        stream = await listener.accept()
                    except OSError as exc:
                        # EMFILE/ENFILE/ENOBUFS: the client waits in the backlog meanwhile.
                        log.error("server.accept_failed", error=str(exc))
                        await anyio.sleep(ACCEPT_RETRY_S)
                        continue
                    conn_tg.start_soon(self._serve_one, stream, work_tg)
            finally:
                self.serving = False

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
            await close_stream(stream, linger=True)
            return
        conn = Connection(
            stream,
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
