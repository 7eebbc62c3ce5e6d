"""Finding the daemon's socket: one rule for the daemon, the CLI and every client.

1. an explicit socket path (`--socket`, `Client(socket_path=...)`),
2. else an explicit root (`--root`, `Client(root=...)`): `ROOT/xumd.sock`,
3. else `$XUM_SOCKET`,
4. else `$XUM_ROOT/xumd.sock`,
5. else the default root's socket: `$XDG_STATE_HOME/xum/xumd.sock`, i.e.
   `~/.local/state/xum/xumd.sock`.

Explicit arguments beat the environment (a command line names what it wants), and `XUM_SOCKET`
beats `XUM_ROOT` (it exists for roots too deep for a Unix socket path, 107 bytes on Linux). An
empty variable counts as unset; a leading `~` (alone or before `/`) is `$HOME`. Nothing here
touches the filesystem: docs/PROTOCOL.md states the same algorithm for plugin authors, with a Lua
and a TypeScript version.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, NamedTuple

SOCKET_NAME = "xumd.sock"

Source = Literal["--socket", "--root", "XUM_SOCKET", "XUM_ROOT", "default"]
"""How the socket was chosen: an explicit socket, an explicit root, either variable, the default."""


def _home(env: Mapping[str, str]) -> str:
    return env.get("HOME") or str(Path.home())


def expand(path: Path | str, env: Mapping[str, str] | None = None) -> Path:
    """`path` with a leading `~` (alone or before `/`) replaced by `$HOME`, as the daemon takes
    its root: a path from a config file or a plugin setting has no shell to expand it."""
    env = os.environ if env is None else env
    text = str(path)
    if text == "~" or text.startswith("~/"):
        return Path(_home(env) + text[1:])
    return Path(text)


def default_root(env: Mapping[str, str] | None = None) -> Path:
    """`$XUM_ROOT`, else `$XDG_STATE_HOME/xum`, else `~/.local/state/xum`."""
    env = os.environ if env is None else env
    if env.get("XUM_ROOT"):
        return expand(env["XUM_ROOT"], env)
    state = env.get("XDG_STATE_HOME") or str(Path(_home(env)) / ".local/state")
    return expand(state, env) / "xum"


# A NamedTuple, not a dataclass: `xum status` imports this module, and `dataclasses` brings
# `inspect` (and with it ast, dis, tokenize): several milliseconds of a run that costs tens.
class SocketChoice(NamedTuple):
    path: Path
    """The socket to connect to (or, for the daemon, to listen on)."""
    source: Source
    root: Path | None
    """The root the path was derived from; None when a socket path was given directly (the
    daemon's `hello` says its root)."""

    def as_dict(self) -> dict[str, str | None]:
        return {
            "socket": str(self.path),
            "source": self.source,
            "root": str(self.root) if self.root is not None else None,
        }


def resolve_socket(
    socket: Path | str | None = None,
    root: Path | str | None = None,
    env: Mapping[str, str] | None = None,
) -> SocketChoice:
    """The socket by the rule above. `socket` and `root` are the explicit choices (flags or
    arguments); `env` defaults to the process environment."""
    env = os.environ if env is None else env
    if socket:
        return SocketChoice(expand(socket, env), "--socket", None)
    if root:
        base = expand(root, env)
        return SocketChoice(base / SOCKET_NAME, "--root", base)
    if env.get("XUM_SOCKET"):
        return SocketChoice(expand(env["XUM_SOCKET"], env), "XUM_SOCKET", None)
    if env.get("XUM_ROOT"):
        base = expand(env["XUM_ROOT"], env)
        return SocketChoice(base / SOCKET_NAME, "XUM_ROOT", base)
    base = default_root(env)
    return SocketChoice(base / SOCKET_NAME, "default", base)
