"""The transport to a host: `ssh HOST xum bridge`, its stdin and stdout one end of a socketpair.

The client keeps the other end, so it speaks to a host exactly as to a local daemon: the same
socket calls, the same timeouts, the same half-close. What differs is what an end of the
connection means: when ssh exits, its status and stderr say whether the host could not be reached
at all (`HostError`: nothing ran there) or the connection dropped while a call was in flight
(`ConnectionLost`: the outcome is unknown, and the message says how to look).

The ssh process runs in a session of its own and is stopped with its whole group when the client
closes (a `ProxyCommand` child goes with it), and reaped: no ssh outlives its client.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

from xum_client import hosts
from xum_client.errors import (
    BridgeFailed,
    ConnectionLost,
    HostError,
    HostKeyRefused,
    HostKeyUnverified,
    HostUnreachable,
    XumClientError,
    XumMissingOnHost,
)

EXIT_WAIT_S = 5.0
"""How long to wait for ssh's exit status after its end of the connection closed."""
CLOSE_GRACE_S = 2.0
"""How long ssh gets to end by itself (its stdin closed), then SIGTERM, then SIGKILL."""
STDERR_CAP = 64 * 1024

_KEY_REFUSED = ("Permission denied", "Too many authentication failures")


def _stderr_detail(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def classify(entry: hosts.HostEntry, status: int | None, stderr: str) -> HostError:
    """The error for an ssh that ended before the daemon answered anything (the TypeScript
    client and the Neovim plugin say the same: tests/support/ssh_failures.json)."""
    detail = _stderr_detail(stderr)
    where = f"host {entry.name!r} ({entry.dest})"

    def error(kind: type[HostError], message: str) -> HostError:
        return kind(message, host=entry.name, status=status, detail=detail)

    if status == hosts.EXIT_SSH_FAILED:
        if "Host key verification failed" in stderr or "HOST IDENTIFICATION HAS CHANGED" in stderr:
            return error(
                HostKeyUnverified,
                f"{where}: ssh could not verify the host's key ({detail}): it is unknown or has "
                f"changed; check it and accept it with `ssh {entry.dest}` once",
            )
        if any(mark in stderr for mark in _KEY_REFUSED):
            return error(
                HostKeyRefused,
                f"{where} refused the key: {detail or 'permission denied'} (ssh -v {entry.dest} "
                "shows which keys were offered)",
            )
        return error(HostUnreachable, f"{where} is unreachable: {detail or 'ssh failed'}")
    if status == hosts.EXIT_COMMAND_NOT_FOUND:
        return error(
            XumMissingOnHost,
            f"xum is not installed on {where} ({detail or 'command not found'}): install it with "
            f"`xum host install {entry.name}`, or put xum on the PATH of its non-interactive shell",
        )
    return error(
        BridgeFailed,
        f"the bridge on {where} failed (ssh exit {status}): {detail or 'no message'}",
    )


def how_to_look(host: str, method: str | None, params: Any) -> str:
    """The command that shows what became of a call whose answer was lost."""
    workspace = None
    if isinstance(params, dict):
        workspace = params.get("workspace_id") or params.get("workspace")
    if workspace and isinstance(workspace, str):
        return f"xum --host {host} ws show {workspace}"
    if isinstance(params, dict):
        project, name = params.get("project_id"), params.get("name")
        if method == "workspace.create" and isinstance(project, str) and isinstance(name, str):
            # `ws show` takes PROJECT/NAME, the project by id too.
            return f"xum --host {host} ws show {shlex.quote(f'{project}/{name}')}"
    if method and method.startswith("project."):
        return f"xum --host {host} project ls"
    return f"xum --host {host} ws ls"


def why_lost(status: int | None, detail: str) -> str:
    """Why a link ended, from ssh's exit status (None: it had not exited) and last line."""
    if status is None:
        return "the bridge closed the connection"
    if status < 0:
        return f"ssh was killed by signal {-status}"
    if status == 0:
        return "the host's daemon closed the connection"
    return f"ssh exited with status {status}" + (f": {detail}" if detail else "")


class SshLink:
    """One `ssh ... xum bridge` process; `sock` is the client's end of its stdin/stdout."""

    def __init__(
        self,
        entry: hosts.HostEntry,
        *,
        root: str | None = None,
        socket_path: str | None = None,
    ) -> None:
        self.entry = entry
        self.argv = hosts.ssh_command(entry, *hosts.bridge_args(entry, root, socket_path))
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(  # noqa: S603 - argv, no shell
                self.argv,
                stdin=theirs.fileno(),
                stdout=theirs.fileno(),
                stderr=self._stderr,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            ours.close()
            self._stderr.close()
            raise XumClientError(
                f"cannot run ssh ({self.argv[0]}) for host {entry.name!r}: {exc.strerror or exc}"
            ) from None
        finally:
            theirs.close()
        self.sock = ours
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr_text(self) -> str:
        try:
            size = os.fstat(self._stderr.fileno()).st_size
            return os.pread(self._stderr.fileno(), STDERR_CAP, max(0, size - STDERR_CAP)).decode(
                errors="replace"
            )
        except (OSError, ValueError):
            return ""

    def exit_status(self, wait_s: float = EXIT_WAIT_S) -> int | None:
        """ssh's exit status once it has exited (bounded wait); None if it still runs. A
        negative status is the signal that killed it.

        It does not reap ssh (`WNOWAIT`): until `close` reaps it, its pid, and so its process
        group's id, cannot be reused, so signalling that group never reaches a stranger."""
        if self.proc.returncode is not None:
            return self.proc.returncode
        deadline = time.monotonic() + wait_s
        while True:
            try:
                info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return self.proc.poll()
            if info is not None and info.si_pid == self.proc.pid:
                if info.si_code == os.CLD_EXITED:
                    return info.si_status
                return -info.si_status
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)

    def failure(self) -> HostError:
        """What ended the link before any answer: ssh's status and stderr, classified."""
        return classify(self.entry, self.exit_status(), self.stderr_text())

    def noise(self, line: bytes) -> HostError:
        """The error for text that is not the protocol before the first answer: the host's
        shell printed it (a startup file that writes for non-interactive shells)."""
        text = line.decode(errors="replace").strip()[:200]
        return BridgeFailed(
            f"the shell on host {self.entry.name!r} ({self.entry.dest}) wrote {text!r} before "
            "xum's bridge ran: a shell startup file prints even for non-interactive sessions "
            f"(make it quiet; `ssh {self.entry.dest} true` must print nothing)",
            host=self.entry.name,
            status=None,
            detail=text,
        )

    def lost(self, method: str | None, params: Any, sent: bool | None = None) -> ConnectionLost:
        """The error for the link ending after the daemon answered: for a call in flight
        (`method`) its outcome is unknown; with no call in flight (None: a stream of events
        being read) it says only where and why. Either way it carries ssh's status."""
        status = self.exit_status()
        detail = _stderr_detail(self.stderr_text())
        why = why_lost(status, detail)
        where = f"connection to host {self.entry.name!r} lost"
        if method is None:
            message = f"{where} ({why})"
        else:
            message = (
                f"{where} during {method} ({why}); the outcome is unknown: the daemon there "
                "finishes or rolls back on its own; look with "
                f"`{how_to_look(self.entry.name, method, params)}`"
            )
        return ConnectionLost(
            message, host=self.entry.name, method=method, sent=sent, status=status, detail=detail
        )

    def close(self) -> None:
        """Close the connection and stop ssh with its process group; reap it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        # Its stdin ended: a healthy ssh ends by itself once the bridge has.
        if self.exit_status(CLOSE_GRACE_S) is None:
            self._signal_group(signal.SIGTERM)
            if self.exit_status(CLOSE_GRACE_S) is None:
                self._signal_group(signal.SIGKILL)
        # Whatever is left in its group (a ProxyCommand's child) goes too, while ssh is still
        # unreaped and its group id therefore ours.
        self._signal_group(signal.SIGKILL)
        self.proc.wait()
        self._stderr.close()

    def _signal_group(self, sig: int) -> None:
        # The group is ssh's own (a new session): its id is ssh's pid, which stays ours until
        # ssh is reaped (only `close` reaps it).
        if self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)
