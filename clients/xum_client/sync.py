"""Blocking client: one socket, one request at a time; notifications are queued for the caller.

Light on purpose (no pydantic, no anyio): the CLI uses it on its start-up path. Typed calls
(`call_model`) import the protocol models only when used.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import socket
import uuid
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from xum_protocol import discovery
from xum_protocol.method_names import MUTATING
from xum_protocol.request_keys import FIELD
from xum_protocol.version import PROTOCOL_VERSION

from xum_client.errors import (
    ClientTimeout,
    ConnectionLost,
    DaemonNotRunning,
    VersionMismatch,
    XumClientError,
    from_error_object,
)

if TYPE_CHECKING:
    from pydantic import BaseModel

    from xum_client.sshlink import SshLink

    M = TypeVar("M", bound=BaseModel)

CLIENT_VERSION = "0.1.0"
"""This client's xum release (the one distribution ships the client, the CLI and xumd: a test keeps
this, `xumd.__version__` and pyproject.toml's version equal). Sent in `hello` as `client.version`
and compared with the daemon's `server.version` (`check_release`)."""


# The stdlib codec, not orjson: loading orjson costs a CLI run about 10 ms, more than the
# encoding of a few small messages ever will. The frames are the same NDJSON.
def encode(message: Any) -> bytes:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def decode(line: bytes) -> Any:
    return json.loads(line)


def with_request_key(
    method: str, params: dict[str, Any] | list[Any] | None, key: str | None = None
) -> dict[str, Any] | list[Any] | None:
    """`params` of a mutating method with a request key (`key`, else a new uuid4): the same
    object when the method is a read, the params are positional, or they name the call
    already."""
    if method not in MUTATING or isinstance(params, list):
        return params
    if params is not None and FIELD in params:
        return params
    return {**(params or {}), FIELD: key or uuid.uuid4().hex}


def default_root() -> Path:
    """XUM_ROOT, else $XDG_STATE_HOME/xum, else ~/.local/state/xum (as the daemon decides)."""
    return discovery.default_root()


def socket_path_for(root: Path | str | None = None) -> Path:
    """The socket by the one rule (`xum_protocol.discovery`): ROOT/xumd.sock for an explicit
    root, else XUM_SOCKET, else XUM_ROOT/xumd.sock, else the default root's."""
    return discovery.resolve_socket(root=root).path


def client_root(root: Path | str | None, choice: discovery.SocketChoice) -> str:
    """The root a client names in its messages: the socket's, else the explicit one (beside an
    explicit socket), else the one XUM_ROOT or the default says (the daemon's `hello` tells the
    truth). Expanded as the socket's is (`~`)."""
    if choice.root is not None:
        return str(choice.root)
    return str(discovery.expand(root) if root else discovery.default_root())


def hello_params(client_name: str) -> dict[str, Any]:
    return {
        "protocol": PROTOCOL_VERSION,
        "client": {"name": client_name, "version": CLIENT_VERSION},
    }


LOCAL_HINT = (
    "restart the daemon from this installation (`xum daemon stop`, then start it again), or use "
    "the xum that matches it"
)


def release_context(root: str, host: str | None) -> tuple[str, str]:
    """Where the daemon runs and how to fix a mismatch, for VersionMismatch's message."""
    if host is None:
        return f"on {root}", LOCAL_HINT
    return (
        f"on host {host}" + (f" ({root})" if root else ""),
        f"run `xum host install {host}` to put this version there, then stop its daemon "
        f"(`xum --host {host} daemon stop`) so the next connection starts the new one",
    )


def release_line(version: str) -> tuple[int, int] | None:
    """`major.minor` of a release string ("0.1.0", "1.2.3rc1", "0.1.0+local"), None when it does
    not start with two numbers."""
    match = re.match(r"(\d{1,6})\.(\d{1,6})(?:\D|$)", version)
    return (int(match[1]), int(match[2])) if match else None


def check_release(
    server: dict[str, Any], where: str, hint: str, client_version: str | None = None
) -> None:
    """Raise VersionMismatch unless `hello`'s `server.version` is this client's major.minor.

    Patch releases mix freely; a daemon whose version cannot be read (absent, not a release
    string) is a mismatch too: the client cannot vouch for what it does not know."""
    mine = client_version or CLIENT_VERSION
    info = server.get("server")
    theirs = info.get("version") if isinstance(info, dict) else None
    theirs = theirs if isinstance(theirs, str) and theirs else "(unknown version)"
    if release_line(theirs) is None or release_line(theirs) != release_line(mine):
        raise VersionMismatch(mine, theirs, where, hint)


def connect_unix(path: str, root: str, timeout: float | None) -> socket.socket:
    """A connected socket, or DaemonNotRunning saying why not."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        sock.close()
        reason = "no socket at " + path if isinstance(exc, FileNotFoundError) else "stale socket"
        raise DaemonNotRunning(root, path, reason) from None
    except PermissionError:
        sock.close()
        raise XumClientError(
            f"permission denied on {path}: the daemon belongs to another user"
        ) from None
    except OSError as exc:
        sock.close()
        raise DaemonNotRunning(root, path, exc.strerror or str(exc)) from None
    return sock


def check_reply(reply: Any, request_id: int) -> dict[str, Any]:
    """The result of `reply` for `request_id`, or the typed error it carries."""
    if not isinstance(reply, dict):
        raise ConnectionLost(f"unexpected reply: {reply!r}")
    if "error" in reply and reply.get("id") in (request_id, None):
        # id null: the daemon could not read our request (e.g. a frame too large).
        raise from_error_object(reply["error"])
    if reply.get("id") != request_id or "result" not in reply:
        raise ConnectionLost(f"unexpected reply: {reply!r}")
    result = reply["result"]
    if not isinstance(result, dict):
        raise ConnectionLost(f"a result must be an object, got {result!r}")
    return result


class Client:
    def __init__(
        self,
        root: Path | str | None = None,
        *,
        socket_path: Path | str | None = None,
        timeout: float | None = 60.0,
        handshake: bool = True,
        client_name: str = "xum-client",
        host: str | None = None,
        check_version: bool = True,
        retry_lost: bool = True,
        request_key: str | None = None,
    ) -> None:
        """`host`: a name from the hosts file (docs/HOSTS.md): the daemon on that machine,
        reached through `ssh ... xum bridge`; `root` and `socket_path` then name the host's.
        `check_version`: after `hello`, refuse (VersionMismatch) a daemon of another xum
        major.minor; off only for what must reach any daemon (`xum daemon status|stop`).
        `retry_lost`: a mutating call whose connection was lost after it was sent is sent
        again once, with its request key, on a new connection (docs/PROTOCOL.md, "Request
        keys"): the daemon answers the first call's outcome instead of doing it twice.
        `request_key`: the key of the first mutating call made (the CLI's `--request-key`),
        so that running the same command again is answered that call's outcome."""
        self.host = host
        self.retry_lost = retry_lost
        self._request_key = request_key
        self._args = (root, socket_path, timeout)
        self._link: SshLink | None = None
        self._ids = itertools.count(1)
        self.notifications: deque[dict[str, Any]] = deque()
        self.server: dict[str, Any] | None = None
        self._client_name = client_name
        self._open(handshake=handshake, check_version=check_version)

    def _open(self, *, handshake: bool, check_version: bool) -> None:
        """Connect (locally or through the host's ssh) and shake hands."""
        root, socket_path, timeout = self._args
        self._peer_ended = False
        self._timed_out: str | None = None
        """Set once a read or write timed out: the stream may hold half a message (and the
        socket's file refuses to read again), so the connection is done (`_usable`)."""
        if self.host is not None:
            from xum_client.hosts import get_host
            from xum_client.sshlink import SshLink

            entry = get_host(self.host)
            self._link = SshLink(
                entry,
                root=str(root) if root is not None else None,
                socket_path=str(socket_path) if socket_path is not None else None,
            )
            self.root = str(root or entry.remote_root or "")
            self.socket_path = str(socket_path or "")
            self._sock = self._link.sock
            self._sock.settimeout(timeout)
        else:
            choice = discovery.resolve_socket(socket_path, root)
            self.root = client_root(root, choice)
            self.socket_path = str(choice.path)
            self._sock = connect_unix(self.socket_path, self.root, timeout)
        self._file = self._sock.makefile("rb")
        if handshake:
            try:
                self.server = self.call("hello", hello_params(self._client_name))
                if check_version:
                    check_release(self.server, *release_context(self.root, self.host))
            except BaseException:
                self.close()
                raise
        if self._link is not None and self.server is not None:
            # The host's own word on where its daemon is.
            self.root = str(self.server.get("root", self.root))
            self.socket_path = str(self.server.get("socket", self.socket_path))

    @property
    def ssh_pid(self) -> int | None:
        """With `host=`: the pid of the ssh process that carries the connection."""
        return self._link.pid if self._link is not None else None

    def call(self, method: str, params: dict[str, Any] | list[Any] | None = None) -> dict[str, Any]:
        """Call `method`; returns its result object or raises the typed error. A mutating
        call is named by a request key (the caller's `request_key` in `params`, else a new
        one), so that when its answer is lost after it was sent (`ConnectionLost`, `sent`) it
        is sent again once on a new connection and answered the first outcome."""
        given = None
        if self._request_key is not None and method in MUTATING:
            given, self._request_key = self._request_key, None
        keyed = with_request_key(method, params, given)
        try:
            return self._call_once(method, keyed)
        except ConnectionLost as lost:
            if not (self.retry_lost and lost.sent and isinstance(keyed, dict) and FIELD in keyed):
                raise
            first = lost
        try:
            self.close()
            self._open(handshake=self.server is not None, check_version=False)
        except (XumClientError, OSError):
            raise first from None  # no daemon to ask again: the outcome stays unknown
        return self._call_once(method, keyed)

    def _call_once(self, method: str, params: dict[str, Any] | list[Any] | None) -> dict[str, Any]:
        try:
            return self._call(method, params)
        except ConnectionLost as exc:
            if self._link is None or not self._peer_ended:
                raise
            if self.server is None and method == "hello":
                # Nothing but the handshake went out: ssh's status says why (no host, no key,
                # no xum, no daemon), and nothing ran there.
                raise self._link.failure() from None
            raise self._link.lost(method, params, sent=exc.sent) from None
        except ClientTimeout as exc:
            if self._link is None:
                raise
            if self.server is not None:
                # A call went out and no answer came in time: as unknown as a dropped one.
                from xum_client.sshlink import how_to_look

                raise ClientTimeout(
                    f"no answer from host {self.host!r} to {method} in time ({exc}); the outcome "
                    f"is unknown: look with `{how_to_look(self._link.entry.name, method, params)}`"
                ) from None
            detail = self._link.stderr_text().strip().splitlines()
            raise ClientTimeout(
                f"no answer from host {self.host!r} in time ({exc})"
                + (f"; ssh said: {detail[-1]}" if detail else "")
            ) from None

    def _usable(self) -> None:
        if self._timed_out is not None:
            raise ConnectionLost(
                f"this connection ended when {self._timed_out} timed out; nothing more was "
                "sent on it: open a new client"
            )

    def _call(self, method: str, params: dict[str, Any] | list[Any] | None) -> dict[str, Any]:
        self._usable()
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": request_id}
        if params is not None:
            message["params"] = params
        try:
            self._sock.sendall(encode(message))
        except (BrokenPipeError, ConnectionResetError):
            # The daemon's end is closed: whatever part went out is never read as a request.
            self._peer_ended = True
            raise ConnectionLost.during(method, False, "the daemon closed the connection") from None
        except TimeoutError:
            self._timed_out = f"sending {method}"
            raise ClientTimeout(f"timed out sending {method}") from None
        while True:
            try:
                reply = self.read_message()
            except ConnectionLost as exc:
                if exc.method is not None:
                    raise
                raise ConnectionLost.during(method, True, str(exc)) from None
            if isinstance(reply, dict) and "method" in reply and "id" not in reply:
                self.notifications.append(reply)
                continue
            return check_reply(reply, request_id)

    def iter_workspaces(
        self, filters: dict[str, Any] | None = None, page: int = 500
    ) -> Iterator[dict[str, Any]]:
        """Every workspace (`filters`: `project_id`, `state`), `page` per `workspace.list`."""
        from xum_client.paging import iter_workspaces

        return iter_workspaces(self.call, filters, page)

    def call_model(self, method: str, params: BaseModel | None, result: type[M]) -> M:
        """Typed call: params and result are protocol models."""
        raw = params.model_dump(mode="json", exclude_none=True) if params is not None else None
        return result.model_validate(self.call(method, raw))

    def notify(self, method: str, params: dict[str, Any] | list[Any] | None = None) -> None:
        """Send a notification (no answer comes)."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self._sock.sendall(encode(message))

    def read_message(self) -> Any:
        self._usable()
        try:
            line = self._file.readline()
        except TimeoutError:
            self._timed_out = "a read"
            raise ClientTimeout("no answer from the daemon in time") from None
        except ConnectionResetError:
            self._peer_ended = True
            raise ConnectionLost("the daemon reset the connection") from None
        if not line:
            self._peer_ended = True
            raise ConnectionLost("the daemon closed the connection")
        if not line.endswith(b"\n"):
            # The end of the stream in the middle of a message: a dropped connection, not a
            # daemon that writes bad JSON.
            self._peer_ended = True
            raise ConnectionLost("the connection ended in the middle of a message")
        try:
            return decode(line)
        except ValueError:
            if self._link is not None and self.server is None:
                # Before the first answer through ssh: the host's shell, not the daemon.
                raise self._link.noise(line) from None
            raise ConnectionLost(f"the daemon sent invalid JSON: {line[:200]!r}") from None

    def next_notification(self) -> dict[str, Any]:
        if self.notifications:
            return self.notifications.popleft()
        try:
            message = self.read_message()
        except ConnectionLost:
            if self._link is None or not self._peer_ended:
                raise
            # Through a host the end is ssh's: its status says why (killed, the host gone, the
            # host's daemon closing), not "the daemon closed the connection".
            raise self._link.lost(None, None) from None
        if not isinstance(message, dict):
            raise ConnectionLost(f"unexpected message: {message!r}")
        return message

    def set_timeout(self, timeout: float | None) -> None:
        """The deadline of each later read and write (None: wait as long as it takes)."""
        self._sock.settimeout(timeout)

    def interrupt(self) -> None:
        """End the connection under a read blocked in another thread: that read sees the
        connection close (ConnectionLost). For a reader thread that must stop."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Idempotent: a retry closes the lost connection before opening a new one."""
        self._file.close()
        self._sock.close()
        if self._link is not None:
            self._link.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
